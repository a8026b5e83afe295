"""The reference DAGs' gate conditions, in process: what the retrain task and the retraining DAG decide."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainpipe.pipelines.dag_gates import drift_says_retrain, gate_passed, new_snapshot

pytestmark = pytest.mark.unit


def test_the_retraining_dag_runs_only_for_a_new_hash_and_says_why_it_skips(capsys):
    """A new user's retrain run without an event stopped at new_snapshot with only Airflow's "Condition result
    is False"; each skip now says why in one line of the task log, as the retrain task does."""

    def events(*extras):
        return {"asset": [SimpleNamespace(extra=e) for e in extras]}

    def said():
        return capsys.readouterr().out.strip().splitlines()

    new = {"md5": "a", "changed": True, "snapshot_dir": "/runs/1/snapshot_dataset"}
    assert new_snapshot(triggering_asset_events=events(new)) == "/runs/1/snapshot_dataset"
    assert said() == ["trainpipe: retraining on the new snapshot /runs/1/snapshot_dataset"]
    same = {"md5": "a", "changed": False, "snapshot_dir": "/runs/2/snapshot_dataset"}
    assert new_snapshot(triggering_asset_events=events(same)) is False
    assert said() == [
        "trainpipe: not retraining: the snapshot /runs/2/snapshot_dataset holds no new data (its "
        "content hash is unchanged)"
    ]
    assert new_snapshot(triggering_asset_events={}) is False
    (line,) = said()
    assert line.startswith("trainpipe: not retraining: the run was not triggered by a snapshot's asset event")
    assert new_snapshot(triggering_asset_events=events({"changed": True})) is False
    assert said() == [
        "trainpipe: not retraining: the triggering asset event names no snapshot_dir (it was not "
        "posted by snapshot_dataset)"
    ]


def test_the_retrain_task_follows_detect_drifts_decision_and_says_why(capsys):
    def ti(result):
        return SimpleNamespace(xcom_pull=lambda task_ids: result if task_ids == "detect_drift" else None)

    drifted = {"retrain": True, "reasons": ["data drifted: 2 of 65 columns (a, b), share 0.031 >= 0.02"]}
    assert drift_says_retrain(ti=ti(drifted)) is True
    steady = {"retrain": False, "reasons": ["no drift: 0 of 65 columns drifted, share 0.000 < 0.5"]}
    assert drift_says_retrain(ti=ti(steady)) is False
    assert drift_says_retrain(ti=ti(None)) is False  # no decision: nothing is retrained on a guess
    assert capsys.readouterr().out.splitlines() == [
        "trainpipe: retraining: data drifted: 2 of 65 columns (a, b), share 0.031 >= 0.02",
        "trainpipe: not retraining: no drift: 0 of 65 columns drifted, share 0.000 < 0.5",
        "trainpipe: not retraining: detect_drift returned no decision",
    ]


@pytest.mark.parametrize(
    ("result", "passed"),
    [
        ({"decision": {"passed": True}}, True),
        ({"decision": {"passed": False, "reasons": ["accuracy 0.41 < 0.9"]}}, False),
        ({"decision": {}}, False),
        (None, False),
    ],
)
def test_the_gate_lets_register_model_run_only_when_the_decision_passed(result, passed):
    """A gate that does not pass is not a failure: the gate task succeeds and Airflow skips what follows it."""
    ti = SimpleNamespace(xcom_pull=lambda task_ids: result if task_ids == "evaluate_model" else None)
    assert gate_passed(ti=ti) is passed
