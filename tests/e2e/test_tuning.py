"""The reference pipeline with tune_model first, on both engines: its workers fan out over one study
(kfp.local runs the compiled dsl.ParallelFor; dag.test() runs the mapped tasks), one step summarizes
it, and train_model takes the best trial's settings on to a registered version that records the study."""

from __future__ import annotations

import sqlite3
import subprocess

import pytest
import yaml

from tests.helpers.pipeline import run_pipeline

pytestmark = pytest.mark.e2e

TUNE = {
    "workers": 2,
    "n_trials": 3,
    "pruner": "none",
    "space": {
        "train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.2, "log": True},
        "batch_size": {"type": "categorical", "choices": [32, 64]},
    },
}


def _run(tmp_path, digits_csv, mlflow_server, engine: str, name: str) -> subprocess.CompletedProcess:
    cfg = {
        "data": str(digits_csv),
        "workspace": str(tmp_path / "ws"),
        "dataset_name": "digits",
        "model_name": name,
        "tracking_uri": mlflow_server,
        "thresholds": {"accuracy": 0.5},
        "train": {"nproc_per_node": 2, "epochs": 2, "batch_size": 64},
        "tune": TUNE,
    }
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return run_pipeline(config, engine, tmp_path)


@pytest.mark.parametrize("engine", ["kfp-local", "airflow-local"])
def test_tuning_fans_out_then_trains_the_best_settings_to_a_registered_version(
    tmp_path, digits_csv, mlflow_server, engine
):
    """Slow on purpose (about a minute on each engine): the pipeline's study fans out real trials, then trains the
    best settings and registers the version whose lineage names the study."""
    import mlflow

    name = f"tuned-{engine}"
    proc = _run(tmp_path, digits_csv, mlflow_server, engine, name)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"registered model : {name} version 1" in proc.stdout, proc.stdout
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "trainpipe tune_model: ok" in ln]
    assert len(lines) == 3 and all("3 complete" in ln for ln in lines), lines  # two workers and the summary
    tags = mlflow.MlflowClient(mlflow_server).get_model_version(name, "1").tags
    study = tags["lineage.tuning.study_name"]
    assert study.startswith("trainpipe-") and tags["lineage.tuning.best_trial"] in ("0", "1", "2")
    if engine == "kfp-local":
        ir = next(yaml.safe_load_all((tmp_path / "ws" / "pipeline.kfp.yaml").read_text()))
        loops = [
            t for t in ir["root"]["dag"]["tasks"].values() if t.get("iteratorPolicy", {}).get("parallelismLimit") == 2
        ] + [
            t
            for c in ir["components"].values()
            for t in c.get("dag", {}).get("tasks", {}).values()
            if t.get("iteratorPolicy", {}).get("parallelismLimit") == 2
        ]
        assert loops and loops[0]["parameterIterator"]["items"]["raw"] == "[0, 1]", loops
    else:
        db = sqlite3.connect(tmp_path / "ws" / "airflow" / "airflow.db")
        mapped = db.execute(
            "select map_index, state from task_instance where task_id = 'tune_model_workers' order by map_index"
        ).fetchall()
        assert mapped == [(0, "success"), (1, "success")], mapped
