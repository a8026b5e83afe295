"""The reference pipeline end to end: kfp.local and Airflow's dag.test()."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml


pytestmark = pytest.mark.e2e


def _config(tmp_path, data, tracking_uri, **extra):
    cfg = {
        "data": str(data),
        "workspace": str(tmp_path / "ws"),
        "dataset_name": "digits",
        "model_name": extra.pop("model_name", "e2e-digits"),
        "tracking_uri": tracking_uri,
        "thresholds": {"accuracy": 0.9},
        "train": {"nproc_per_node": 2, "epochs": 4, "batch_size": 64},
        **extra,
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(config, engine, tmp_path):
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    return subprocess.run([sys.executable, "-m", "trainpipe.cli", "run", "--config", str(config), "--engine", engine], capture_output=True, text=True, env=env, timeout=900, check=False)


def test_kfp_local_end_to_end_is_idempotent_and_carries_lineage(tmp_path, digits_csv, mlflow_server):
    import mlflow

    config = _config(tmp_path, digits_csv, mlflow_server)
    first = _run(config, "kfp-local", tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "registered model : e2e-digits version 1 alias @champion (new)" in first.stdout
    second = _run(config, "kfp-local", tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "version 1 alias @champion (existing version" in second.stdout
    md5 = [l for l in first.stdout.splitlines() if l.startswith("DVC snapshot")][0].split()[4]
    assert md5 in second.stdout
    client = mlflow.MlflowClient(mlflow_server)
    assert len(client.search_model_versions("name = 'e2e-digits'")) == 1
    tags = client.get_model_version_by_alias("e2e-digits", "champion").tags
    assert tags["lineage.snapshot.md5"] == md5
    assert tags["lineage.source.md5"] == md5  # validated bytes are the raw bytes
    assert tags["lineage.orchestrator.name"] == "kfp" and tags["lineage.orchestrator.run_id"]
    assert tags["lineage.validation.success"] == "True"
    assert tags["lineage.training.world_size"] == "2"
    assert tags["lineage.code.trainpipe"] == "0.1.0"
    assert float(tags["lineage.profile.samples_per_second"]) > 0
    assert tags["lineage.steps"].split(",")[:3] == ["validate_data", "snapshot_dataset", "train_model"]


@pytest.mark.parametrize("corruption", ["nan_label", "missing_label_column"])
def test_corrupted_input_stops_at_validate_data(tmp_path, digits_csv, mlflow_server, corruption):
    import mlflow
    import pandas as pd

    df = pd.read_csv(digits_csv)
    if corruption == "nan_label":
        df.loc[5, "label"] = None
    else:
        df = df.drop(columns=["label"])
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    name = f"e2e-bad-{corruption}".replace("_", "-")
    proc = _run(_config(tmp_path, bad, mlflow_server, model_name=name), "kfp-local", tmp_path)
    assert proc.returncode != 0
    assert "trainpipe validate_data: error: suite 'trainpipe_default' failed" in proc.stdout + proc.stderr
    assert "trainpipe snapshot_dataset" not in proc.stdout + proc.stderr
    assert mlflow.MlflowClient(mlflow_server).search_model_versions(f"name = '{name}'") == []


def test_airflow_dag_test_end_to_end(tmp_path, digits_csv, mlflow_server):
    import mlflow

    config = _config(tmp_path, digits_csv, mlflow_server, model_name="e2e-airflow")
    proc = _run(config, "airflow-local", tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "registered model : e2e-airflow version 1 alias @champion (new)" in proc.stdout
    tags = mlflow.MlflowClient(mlflow_server).get_model_version_by_alias("e2e-airflow", "champion").tags
    assert tags["lineage.orchestrator.name"] == "airflow" and tags["lineage.orchestrator.run_id"].startswith("manual__")
    # snapshot_dataset updated the dataset's Asset with the DVC hash: what retrain_dag listens to
    import json
    import sqlite3

    db = sqlite3.connect(tmp_path / "ws" / "airflow" / "airflow.db")
    rows = db.execute("select a.uri, e.extra from asset_event e join asset a on a.id = e.asset_id").fetchall()
    assert len(rows) == 1 and rows[0][0] == "trainpipe://datasets/digits"
    extra = json.loads(rows[0][1])
    assert extra["md5"] == tags["lineage.snapshot.md5"] and extra["changed"] is True and extra["snapshot_dir"].endswith("/snapshot_dataset")


def test_airflow_gate_not_passed_skips_register(tmp_path, digits_csv, mlflow_server):
    """A gate that does not pass is not a failure: the run succeeds, the gate task succeeds and
    register_model (everything after the gate) is skipped, so nothing is registered."""
    import sqlite3

    import mlflow

    config = _config(tmp_path, digits_csv, mlflow_server, model_name="e2e-gate", thresholds={"accuracy": 0.9999},
                     train={"nproc_per_node": 1, "epochs": 1, "batch_size": 64})
    proc = _run(config, "airflow-local", tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "registered model : none" in proc.stdout
    db = sqlite3.connect(tmp_path / "ws" / "airflow" / "airflow.db")
    states = dict(db.execute("select task_id, state from task_instance").fetchall())
    assert states["evaluate_model"] == "success" and states["gate"] == "success", states
    assert states["register_model"] == "skipped", states
    assert mlflow.MlflowClient(mlflow_server).search_registered_models(filter_string="name = 'e2e-gate'") == []


def test_retrain_dag_runs_only_for_a_new_hash():
    from types import SimpleNamespace

    from trainpipe.faces.airflow_face import new_snapshot

    def events(*extras):
        return {"asset": [SimpleNamespace(extra=e) for e in extras]}

    assert new_snapshot(triggering_asset_events=events({"md5": "a", "changed": True, "snapshot_dir": "/runs/1/snapshot_dataset"})) == "/runs/1/snapshot_dataset"
    assert new_snapshot(triggering_asset_events=events({"md5": "a", "changed": False, "snapshot_dir": "/runs/2/snapshot_dataset"})) is False
    assert new_snapshot(triggering_asset_events={}) is False
