"""The Airflow rendering's gates: the conditions a :class:`~trainpipe.faces.airflow_operator.GateOperator` decides
on (each reads the result of the step the graph says decides it: :data:`~trainpipe.pipelines.graph.CONDITIONS`),
and the dataset's Asset with the retraining DAG's first gate, which weighs the snapshots' events."""

from __future__ import annotations

from typing import Any

from trainpipe.pipelines import graph

#: The gate tasks' own settings, by condition.
GATES: dict[str, dict[str, Any]] = {
    "retrain": {
        "retries": 0,
        "doc_md": "Continue only when detect_drift decided to retrain; a skip logs why in one line.",
    },
    "gate-passed": {"doc_md": "Continue only when evaluate_model's decision passed."},
}


def drift_says_retrain(ti: Any = None, **_: Any) -> bool:
    """Gate condition: detect_drift's decision. The reason goes into the task log as one line (the
    audit log has detect_drift's own record of it)."""
    result = ti.xcom_pull(task_ids=graph.RETRAIN.decided_by) or {}
    retrain = bool(result.get("retrain"))
    reason = (result.get("reasons") or [f"{graph.RETRAIN.decided_by} returned no decision"])[0]
    print(f"trainpipe: {'retraining' if retrain else 'not retraining'}: {reason}", flush=True)  # the task log
    return retrain


def gate_passed(ti: Any = None, **_: Any) -> bool:
    """Gate condition: True when evaluate_model's decision passed."""
    result = ti.xcom_pull(task_ids=graph.GATE_PASSED.decided_by)
    return bool(result and result.get("decision", {}).get("passed"))


#: Each condition's gate function.
GATE_CONDITIONS = {"retrain": drift_says_retrain, "gate-passed": gate_passed}


def dataset_asset(dataset_name: str) -> Any:
    """The Airflow Asset a dataset's snapshots update (snapshot_dataset emits it with the DVC hash)."""
    from airflow.sdk import Asset

    return Asset(
        name=f"trainpipe-dataset-{dataset_name}", uri=f"trainpipe://datasets/{dataset_name}", group="trainpipe"
    )


def _made_at(event: Any) -> str:
    """When an event's snapshot was made (its extra's ``made_at``, else the event's own timestamp), as
    sortable text: Airflow hands a run its triggering events in no promised order."""
    made = (getattr(event, "extra", None) or {}).get("made_at")
    stamp: Any = getattr(event, "timestamp", None)
    return str(made or (stamp.isoformat() if hasattr(stamp, "isoformat") else stamp or ""))


def _why_not(extra: dict[str, Any]) -> str | None:
    """Why an event's snapshot is no new data for the retraining DAG to weigh, or None: it is."""
    if not extra.get("snapshot_dir"):
        return "the triggering asset event names no snapshot_dir (it was not posted by snapshot_dataset)"
    if not extra.get("changed"):
        return f"the snapshot {extra['snapshot_dir']} holds no new data (its content hash is unchanged)"
    if extra.get("trained_by"):
        return f"{extra['trained_by']} trains this snapshot itself"
    return None


def new_snapshot(triggering_asset_events: Any = None, **_: Any) -> str | bool:
    """Gate condition of the retraining DAG: the directory of the newest snapshot of the run's batch of events
    that holds new data (its content hash is new) and that no run trains itself (the training DAG trains its
    own: two runs training one snapshot race to move the alias), else False (skip).

    Every event of the batch is weighed, whatever the others say (the training DAG's own event or an unchanged
    one hides no ingest beside it), and each one not compared is named in the task log with why: an older new
    snapshot is the dataset's previous version (snapshot_dataset keeps one dataset per name, in versions), so
    detect_drift compares the newest, which is the data as it is now."""
    events = sorted((e for evs in (triggering_asset_events or {}).values() for e in evs), key=_made_at)
    if not events:
        return _skip(
            "the run was not triggered by a snapshot's asset event (trigger it by one, or run the training DAG)"
        )
    if len(events) == 1:
        reason = _why_not(dict(events[0].extra or {}))
        if reason:
            return _skip(reason)
        return _retrain_on(str(events[0].extra["snapshot_dir"]))
    weighed = [(e, dict(e.extra or {})) for e in events]
    new = [extra for _, extra in weighed if _why_not(extra) is None]
    chosen = new[-1] if new else None
    for i, (event, extra) in enumerate(weighed, 1):
        if extra is chosen:
            continue
        reason = _why_not(extra) or (
            f"the snapshot {extra['snapshot_dir']} is an older version of the dataset than "
            f"{chosen['snapshot_dir'] if chosen else ''}, which is compared instead"
        )
        print(f"trainpipe: skipped event {i} of {len(events)} (made at {_made_at(event)}): {reason}", flush=True)
    if chosen is None:
        return _skip(f"none of the {len(events)} asset events of this run holds a new snapshot to weigh (each above)")
    return _retrain_on(str(chosen["snapshot_dir"]), f" (the newest new data of {len(events)} asset events)")


def _retrain_on(snapshot_dir: str, note: str = "") -> str:
    print(f"trainpipe: retraining on the new snapshot {snapshot_dir}{note}", flush=True)  # the task log
    return snapshot_dir


def _skip(reason: str) -> bool:
    """A gate's skip, with its reason as one line in the task log (the steps after it are skipped)."""
    print(f"trainpipe: not retraining: {reason}", flush=True)
    return False
