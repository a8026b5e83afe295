"""The retraining DAG's first task on a batch of asset events (issue 53 §3): every event is weighed, the newest new
snapshot is compared, and each event not compared is named in the task log with why."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainpipe.pipelines.dag_gates import new_snapshot

pytestmark = pytest.mark.unit


def _event(snapshot_dir: str, minute: int, **extra) -> SimpleNamespace:
    made_at = f"2026-11-25T10:{minute:02d}:00+00:00"
    return SimpleNamespace(extra={"changed": True, "snapshot_dir": snapshot_dir, "made_at": made_at, **extra})


def _said(capsys) -> list[str]:
    return capsys.readouterr().out.strip().splitlines()


def test_drifted_ingests_beside_the_training_dags_own_event_are_weighed(capsys):
    """Three ingests arrived with the training DAG's own (newer) event: the run skipped them all, saying only
    that the training run trains its snapshot. The newest ingest is compared; the others are each named."""
    batch = [_event(f"/ingest/{i}", i) for i in range(3)]
    batch.append(_event("/train/9", 9, trained_by="run manual__1 of trainpipe_training"))
    assert new_snapshot({"asset": batch[::-1]}) == "/ingest/2"
    lines = _said(capsys)
    assert lines[-1] == "trainpipe: retraining on the new snapshot /ingest/2 (the newest new data of 4 asset events)"
    skipped = lines[:-1]
    assert len(skipped) == 3, lines  # each event not compared, once
    assert skipped[0].startswith("trainpipe: skipped event 1 of 4 (made at 2026-11-25T10:00:00+00:00): ")
    assert "/ingest/0 is an older version of the dataset than /ingest/2, which is compared instead" in skipped[0]
    assert "/ingest/1 is an older version" in skipped[1]
    assert skipped[2].endswith("run manual__1 of trainpipe_training trains this snapshot itself")


def test_an_unchanged_newest_event_hides_no_new_data_before_it(capsys):
    """Another run logged only "holds no new data": its newest event was unchanged, an older one was new."""
    batch = [_event("/ingest/1", 1), _event("/ingest/2", 2, changed=False), SimpleNamespace(extra={"changed": True})]
    assert new_snapshot({"asset": batch}) == "/ingest/1"
    lines = _said(capsys)
    assert any("/ingest/2 holds no new data (its content hash is unchanged)" in line for line in lines), lines
    assert any("names no snapshot_dir" in line for line in lines), lines
    assert lines[-1].startswith("trainpipe: retraining on the new snapshot /ingest/1")


def test_a_batch_with_nothing_new_says_so_for_each_event(capsys):
    batch = [_event("/ingest/1", 1, changed=False), _event("/train/2", 2, trained_by="run r of trainpipe_training")]
    assert new_snapshot({"asset": batch}) is False
    lines = _said(capsys)
    assert len(lines) == 3 and lines[0].startswith("trainpipe: skipped event 1 of 2"), lines
    assert lines[-1] == (
        "trainpipe: not retraining: none of the 2 asset events of this run holds a new snapshot to weigh (each above)"
    )
