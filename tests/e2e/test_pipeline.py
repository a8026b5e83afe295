"""The reference pipeline end to end: kfp.local and Airflow's dag.test()."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.pipeline import run_pipeline

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
    return run_pipeline(config, engine, tmp_path)


STEPS = (
    "validate_data",
    "snapshot_dataset",
    "detect_drift",
    "train_model",
    "profile_training",
    "evaluate_model",
    "register_model",
)


def _terminal(proc) -> list[str]:
    """What a person sees: stdout and stderr, non-empty lines."""
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def test_kfp_local_end_to_end_is_idempotent_and_carries_lineage(tmp_path, digits_csv, mlflow_server):
    """Slow on purpose (about 1.5 minutes): the reference pipeline runs three times through kfp.local (a first run,
    a rerun that must reuse the version, a drift run that must skip), each a whole chain from raw data."""
    import mlflow

    # retrain_on drift with no champion yet: nothing to compare with, so it trains (the dsl.If branch
    # runs); the cpu-smb profile optimizes the model for CPU and registers that variant beside it
    config = _config(tmp_path, digits_csv, mlflow_server, retrain_on="drift", profile="cpu-smb")
    first = _run(config, "kfp-local", tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "registered model : e2e-digits version 1 alias @champion (new)" in first.stdout
    assert "optimized model  : models:/e2e-digits-onnx/1 (loads with MLflow + onnxruntime)" in first.stdout, (
        first.stdout
    )
    assert "0 of 0 columns drifted; retrain" in first.stdout
    config = _config(tmp_path, digits_csv, mlflow_server)  # retrain_on always (the default): trains again
    second = _run(config, "kfp-local", tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "version 1 alias @champion (existing version" in second.stdout
    md5 = [line for line in first.stdout.splitlines() if line.startswith("DVC snapshot")][0].split()[4]
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
    assert float(tags["lineage.training_profile.samples_per_second"]) > 0
    assert tags["lineage.steps"].split(",")[:3] == ["validate_data", "snapshot_dataset", "train_model"]
    # the terminal shows each step's one result line and the summary; the engine's own output (KFP's
    # executor JSON, a few thousand lines) is in the log file the summary names
    shown = _terminal(first)
    assert len(shown) <= 24, "\n".join(shown)
    for step in (*STEPS, "optimize_model"):
        assert sum(1 for line in shown if line.strip().startswith(f"trainpipe {step}: ok in ")) == 1, (step, shown)
    optimized = client.get_model_version_by_alias("e2e-digits-onnx", "champion")
    assert (
        optimized.tags["trainpipe.parent_version"] == "e2e-digits/1"
        and optimized.tags["lineage.orchestrator.name"] == "kfp"
    )
    assert tags["trainpipe.optimized_version"] == "e2e-digits-onnx/1"
    log = Path(next(line for line in shown if line.startswith("full log")).split(":", 1)[1].strip())
    assert (
        log.is_file()
        and len(log.read_text().splitlines()) > 10 * len(shown)
        and "trainpipe register_model: ok" in log.read_text()
    )
    # every command takes the config `trainpipe run` took (./pipeline.yaml here): no --tracking-uri needed
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    lineage = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "lineage", "models:/e2e-digits@champion"],
        cwd=config.parent,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert lineage.returncode == 0, lineage.stderr[-2000:]
    assert f"DVC md5 {md5}" in lineage.stdout and "verify     OK" in lineage.stdout
    # retrain_on drift, the same data: detect_drift compares it with the champion's training data
    # (fetched through its lineage) and the dsl.If branch of the model steps does not run
    third = _run(_config(tmp_path, digits_csv, mlflow_server, retrain_on="drift"), "kfp-local", tmp_path)
    assert third.returncode == 0, third.stderr[-4000:]
    assert "registered model : none (not retrained: no drift: 0 of 65 columns drifted" in third.stdout, third.stdout
    shown = _terminal(third)
    assert any(line.strip().startswith("trainpipe detect_drift: ok in ") for line in shown)
    assert not any("trainpipe train_model" in line for line in shown), shown
    assert len(client.search_model_versions("name = 'e2e-digits'")) == 1


@pytest.mark.parametrize(
    ("corruption", "engine"), [("na_in_a_feature", "kfp-local"), ("missing_label_column", "airflow-local")]
)
def test_corrupted_input_stops_at_validate_data(tmp_path, digits_csv, mlflow_server, corruption, engine):
    """Bad data stops at the first step, before anything is snapshotted, and the run ends with the
    step's name, its one line and its own exit code (3: the data failed its suite), on either engine."""
    import mlflow
    import pandas as pd

    df = pd.read_csv(digits_csv)
    if corruption == "na_in_a_feature":
        df["pixel_0_3"] = df["pixel_0_3"].astype(object)
        df.loc[5, "pixel_0_3"] = "N/A"
    else:
        df = df.drop(columns=["label"])
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    name = f"e2e-bad-{corruption}".replace("_", "-")
    proc = _run(_config(tmp_path, bad, mlflow_server, model_name=name), engine, tmp_path)
    shown = _terminal(proc)
    assert proc.returncode == 3, "\n".join(shown[-20:])
    failed = [line for line in shown if line.startswith("trainpipe run: step ")]
    assert len(failed) == 1 and failed[0].startswith(
        "trainpipe run: step validate_data failed (exit 3): suite 'trainpipe_default' failed"
    ), shown
    said = [line for line in shown if "suite 'trainpipe_default' failed" in line]
    assert said == failed, shown  # the failure reads once: not the step's line, then a retry's, then the summary
    column = "pixel_0_3" if corruption == "na_in_a_feature" else "label"
    assert f"column={column}" in failed[0] and ("row 5" in failed[0] if column == "pixel_0_3" else True), failed[
        0
    ]  # pandas reads "N/A" as missing
    assert (
        shown[-1].startswith("trainpipe run: full log: ")
        and len(shown) <= 8
        and "Traceback" not in proc.stdout + proc.stderr
    ), shown
    assert "snapshot_dataset" not in proc.stdout + proc.stderr
    assert (
        not any((tmp_path / "ws" / "dvc-remote").rglob("*.csv"))
        and not (tmp_path / "ws" / "dvc-repo" / "data").exists()
    )
    assert mlflow.MlflowClient(mlflow_server).search_model_versions(f"name = '{name}'") == []


def test_airflow_dag_test_end_to_end(tmp_path, digits_csv, mlflow_server):
    """Slow on purpose (about 1.3 minutes): the training DAG runs every step for real under dag.test(), from raw
    data to a registered version."""
    import mlflow

    config = _config(
        tmp_path,
        digits_csv,
        mlflow_server,
        model_name="e2e-airflow",
        optimize={"enabled": True, "variants": ["int8_dynamic", "int8_static"], "max_metric_drop": 0.02},
    )
    proc = _run(config, "airflow-local", tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "registered model : e2e-airflow version 1 alias @champion (new)" in proc.stdout
    assert "optimized model  : models:/e2e-airflow-onnx/1 (loads with MLflow + onnxruntime)" in proc.stdout, proc.stdout
    tags = mlflow.MlflowClient(mlflow_server).get_model_version_by_alias("e2e-airflow", "champion").tags
    assert tags["lineage.orchestrator.name"] == "airflow" and tags["lineage.orchestrator.run_id"].startswith("manual__")
    # snapshot_dataset updated the dataset's Asset with the DVC hash: what retrain_dag listens to
    import json
    import sqlite3

    db = sqlite3.connect(tmp_path / "ws" / "airflow" / "airflow.db")
    rows = db.execute("select a.uri, e.extra from asset_event e join asset a on a.id = e.asset_id").fetchall()
    assert len(rows) == 1 and rows[0][0] == "trainpipe://datasets/digits"
    extra = json.loads(rows[0][1])
    assert (
        extra["md5"] == tags["lineage.snapshot.md5"]
        and extra["changed"] is True
        and extra["snapshot_dir"].endswith("/snapshot_dataset")
    )
    # retrain_on drift, the same data: the retrain task skips the model steps and says why in one line
    again = _run(
        _config(tmp_path, digits_csv, mlflow_server, model_name="e2e-airflow", retrain_on="drift"),
        "airflow-local",
        tmp_path,
    )
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "registered model : none (not retrained: no drift: 0 of 65 columns drifted" in again.stdout
    run_id = db.execute("select run_id from dag_run order by id desc limit 1").fetchone()[0]
    states = dict(db.execute("select task_id, state from task_instance where run_id = ?", (run_id,)).fetchall())
    assert states["detect_drift"] == "success" and states["retrain"] == "success", states
    assert {states[t] for t in ("train_model", "profile_training", "evaluate_model", "gate", "register_model")} == {
        "skipped"
    }, states
    log = Path(
        next(line for line in _terminal(again) if line.startswith("full log")).split(":", 1)[1].strip()
    ).read_text()
    assert "trainpipe: not retraining: no drift: 0 of 65 columns drifted" in log


def test_airflow_gate_not_passed_skips_register(tmp_path, digits_csv, mlflow_server):
    """A gate that does not pass is not a failure: the run succeeds, the gate task succeeds and
    register_model (everything after the gate) is skipped, so nothing is registered."""
    import sqlite3

    import mlflow

    config = _config(
        tmp_path,
        digits_csv,
        mlflow_server,
        model_name="e2e-gate",
        thresholds={"accuracy": 0.9999},
        train={"nproc_per_node": 1, "epochs": 1, "batch_size": 64},
    )
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

    from trainpipe.pipelines.dag_topology import new_snapshot

    def events(*extras):
        return {"asset": [SimpleNamespace(extra=e) for e in extras]}

    assert (
        new_snapshot(
            triggering_asset_events=events({"md5": "a", "changed": True, "snapshot_dir": "/runs/1/snapshot_dataset"})
        )
        == "/runs/1/snapshot_dataset"
    )
    assert (
        new_snapshot(
            triggering_asset_events=events({"md5": "a", "changed": False, "snapshot_dir": "/runs/2/snapshot_dataset"})
        )
        is False
    )
    assert new_snapshot(triggering_asset_events={}) is False


def test_the_retrain_task_follows_detect_drifts_decision_and_says_why(capsys):
    from types import SimpleNamespace

    from trainpipe.pipelines.dag_topology import drift_says_retrain

    def ti(result):
        return SimpleNamespace(xcom_pull=lambda task_ids: result if task_ids == "detect_drift" else None)

    assert (
        drift_says_retrain(
            ti=ti({"retrain": True, "reasons": ["data drifted: 2 of 65 columns (a, b), share 0.031 >= 0.02"]})
        )
        is True
    )
    assert (
        drift_says_retrain(
            ti=ti({"retrain": False, "reasons": ["no drift: 0 of 65 columns drifted, share 0.000 < 0.5"]})
        )
        is False
    )
    assert drift_says_retrain(ti=ti(None)) is False  # no decision: nothing is retrained on a guess
    assert capsys.readouterr().out.splitlines() == [
        "trainpipe: retraining: data drifted: 2 of 65 columns (a, b), share 0.031 >= 0.02",
        "trainpipe: not retraining: no drift: 0 of 65 columns drifted, share 0.000 < 0.5",
        "trainpipe: not retraining: detect_drift returned no decision",
    ]
