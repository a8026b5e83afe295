"""The hardware profile reaches the reference DAGs' tasks, as it reaches the KFP pipeline's: retries, backoff, the
timeouts (train_model's its own) and the bound on preemptions that spend no retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.unit


@pytest.fixture
def dagbag(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    profile = tmp_path / "profile.yaml"
    profile.write_text(
        yaml.safe_dump(
            {"name": "site", "retries": 1, "retry_backoff_s": 7, "timeout_s": 120, "train_timeout_s": 900}
            | {"max_preemptions": 2}
        )
    )
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({"data": str(tmp_path / "d.csv"), "profile": str(profile), "schedule": None}))
    monkeypatch.setenv("TRAINPIPE_CONFIG", str(config))
    monkeypatch.setenv("TRAINPIPE_AIRFLOW_MODE", "local")
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag


def test_every_task_takes_the_profiles_retries_backoff_and_timeouts(dagbag):
    trainpipe_tasks = 0
    for dag in dagbag.dags.values():
        for task in dag.tasks:
            if task.task_id == "train_model":
                assert task.execution_timeout == timedelta(seconds=900)
                assert task.max_preemptions == 2
            elif task.task_id not in ("approve",):
                assert task.execution_timeout == timedelta(seconds=120), task.task_id
            if task.task_id not in ("validate_data", "gate", "new_snapshot", "retrain"):  # those retry nothing
                assert task.retries == 1 and task.retry_delay == timedelta(seconds=7), task.task_id
                trainpipe_tasks += 1
    assert trainpipe_tasks >= 8
