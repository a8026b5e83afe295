"""Models anyone can load: a registered model, built-in or a team's, loads with plain MLflow in a
fresh virtualenv where trainpipe is not installed (only the requirements the model declares), takes
a DataFrame of raw feature columns, and is served by ``mlflow models serve --env-manager local``.

Regression runs end to end on scikit-learn's bundled diabetes data through ``trainpipe run``, with
optimize_model on: its ONNX variant is registered beside the model and loads there too;
the team's classifier (tests/fixtures/teampkg) goes through the entrypoints, and its code
travels with the model (the fresh environment has no teampkg on its path).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, _free_port, make_snapshot, result_of, run_component, wait_http

pytestmark = pytest.mark.e2e

TEAM = {"PYTHONPATH": str(REPO / "tests" / "fixtures")}


@pytest.fixture(scope="module")
def diabetes_csv(tmp_path_factory) -> Path:
    from sklearn.datasets import load_diabetes

    path = tmp_path_factory.mktemp("diabetes") / "diabetes.csv"
    load_diabetes(as_frame=True, scaled=False).frame.to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def registered(tmp_path_factory, diabetes_csv, digits_csv, mlflow_server):
    """The regression pipeline through `trainpipe run`, and the team's classifier by hand, both registered."""
    root = tmp_path_factory.mktemp("serving")
    config = root / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": str(diabetes_csv),
                "label_column": "target",
                "workspace": str(root / "ws"),
                "dataset_name": "diabetes",
                "model_name": "diabetes",
                "tracking_uri": mlflow_server,
                "thresholds": {"r2": 0.25},
                "max_regression": {"rmse": 0.0},
                "train": {
                    "task": "regression",
                    "train_config": {"hidden_units": [32], "learning_rate": 0.01},
                    "nproc_per_node": 1,
                    "epochs": 40,
                    "batch_size": 32,
                },
                "optimize": {"enabled": True, "max_metric_drop": 0.01, "latency_runs": 50},
            }
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "registered model : diabetes version 1 alias @champion (new)" in run.stdout
    assert "optimized model  : models:/diabetes-onnx/1 (loads with MLflow + onnxruntime)" in run.stdout, run.stdout
    # the team's model, by hand: its package is on the path of the steps that train and evaluate it
    snap = make_snapshot(root / "team", digits_csv, "label")
    result_of(
        run_component(
            "train_model",
            "--data",
            str(snap),
            "--output-dir",
            str(root / "team" / "m"),
            "--tracking-uri",
            mlflow_server,
            "--train-function",
            "teampkg.train:train",
            "--train-config",
            '{"width": 24}',
            "--nproc-per-node",
            "1",
            "--epochs",
            "3",
            env=TEAM,
        )
    )
    result_of(
        run_component(
            "evaluate_model",
            "--model",
            str(root / "team" / "m"),
            "--data",
            str(snap),
            "--output-dir",
            str(root / "team" / "e"),
            "--thresholds",
            '{"accuracy": 0.3}',
            "--model-name",
            "team-digits",
            "--tracking-uri",
            mlflow_server,
            env={**TEAM, "TRAINPIPE_TRUSTED_MODEL_CODE": "teampkg"},
        )
    )
    reg = result_of(
        run_component(
            "register_model",
            "--model",
            str(root / "team" / "m"),
            "--decision",
            str(root / "team" / "e"),
            "--output-dir",
            str(root / "team" / "r"),
            "--model-name",
            "team-digits",
            "--tracking-uri",
            mlflow_server,
        )
    )
    assert reg["model_uri"] == "models:/team-digits@champion"
    return {"regression_ws": root / "ws", "team_model": root / "team" / "m"}


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory, registered, mlflow_server) -> Path:
    """A new virtualenv with what the registered model says it needs, and nothing of trainpipe."""
    import mlflow

    # models:/ URIs resolve through the registry URI, which download_artifacts does not take from
    # tracking_uri=; mlflow.set_registry_uri would also export it to every later subprocess
    with _env(MLFLOW_REGISTRY_URI=mlflow_server):
        reqs = [
            Path(
                mlflow.artifacts.download_artifacts(
                    artifact_uri=f"models:/{name}@champion/requirements.txt",
                    tracking_uri=mlflow_server,
                    dst_path=str(tmp_path_factory.mktemp("reqs")),
                )
            )
            for name in ("diabetes", "diabetes-onnx")
        ]
    assert (
        "onnxruntime==1.32.0" in reqs[1].read_text() and "torch" not in reqs[1].read_text()
    )  # the ONNX variant needs no torch
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(reqs[0]), "-r", str(reqs[1])],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    return venv


@contextlib.contextmanager
def _env(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _in_fresh_env(venv: Path, code: str, server: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"MLFLOW_TRACKING_URI": server, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"})
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
        check=False,
    )


def test_regression_is_scored_gated_and_registered_with_its_charts(registered, mlflow_server):
    """Slow when it runs first (about 1.5 minutes in setup): the module's fixture runs the regression pipeline through
    `trainpipe run` and trains the team's classifier, once for every test here."""
    import mlflow

    evaluated = next(registered["regression_ws"].rglob("evaluate-model/decision/metrics.json"))
    metrics = json.loads(evaluated.read_text())
    assert metrics["task"] == "regression" and set(metrics["metrics"]) == {"mae", "rmse", "r2"}
    assert metrics["metrics"]["r2"] >= 0.25 and metrics["lower_is_better"] == ["mae", "rmse"]
    report = (evaluated.parent / "report.html").read_text()
    assert all(t in report for t in ("Predicted against actual", "Residuals against predicted", "id='residuals'"))
    version = mlflow.MlflowClient(mlflow_server).get_model_version_by_alias("diabetes", "champion")
    assert (
        version.tags["lineage.evaluation.task"] == "regression"
        and version.tags["lineage.training.task"] == "regression"
    )
    # optimize_model on the regression task: r2 on the same held-out rows evaluate_model scored, every
    # variant gated on its drop, the ONNX export within its tolerance of torch
    optimized = json.loads(
        next(registered["regression_ws"].rglob("optimize-model/optimized/optimization.json")).read_text()
    )
    v = {x["name"]: x for x in optimized["variants"]}
    assert optimized["metric"] == "r2" and list(v) == ["fp32", "onnx", "int8_dynamic", "int8_static", "pruned"]
    assert (
        v["fp32"]["metric"] == pytest.approx(metrics["metrics"]["r2"], abs=1e-9)
        and optimized["n_test"] == metrics["n_test"]
    )
    assert v["onnx"]["max_abs_diff"] <= 1e-3 and v["onnx"]["accepted"]
    assert all(x["accepted"] == (x["metric_drop"] <= 0.01) for n, x in v.items() if n != "fp32")
    assert set(v["fp32"]["metrics"]) == {"r2", "rmse", "mae"} and optimized["selected"] in v


def test_registered_models_load_by_alias_without_trainpipe_and_predict_as_trainpipe_does(
    fresh_env, registered, mlflow_server, diabetes_csv, digits_csv, tmp_path, monkeypatch
):
    """Slow on purpose (about 2 minutes, most of it the module's fixtures): a fresh virtualenv is built with only what
    the registered models say they need, nothing of trainpipe, and each model is loaded and served from it; that
    separation is the claim, and no cached environment would show it."""
    import pandas as pd

    from trainpipe.services.serving import loader

    probe = _in_fresh_env(
        fresh_env,
        "import importlib.util; print(importlib.util.find_spec('trainpipe'), importlib.util.find_spec('teampkg'))",
        mlflow_server,
        tmp_path,
    )
    assert probe.stdout.strip() == "None None", probe.stderr[-2000:]
    rows = pd.read_csv(diabetes_csv).drop(columns=["target"]).head(25)
    rows.to_csv(tmp_path / "diabetes.csv", index=False)
    digits = pd.read_csv(digits_csv).drop(columns=["label"]).head(25)
    digits.to_csv(tmp_path / "digits.csv", index=False)
    code = (
        "import mlflow, pandas as pd, json\n"
        "r = mlflow.pyfunc.load_model('models:/diabetes@champion').predict(pd.read_csv('diabetes.csv'))\n"
        "t = mlflow.pyfunc.load_model('models:/team-digits@champion').predict(pd.read_csv('digits.csv'))\n"
        "o = mlflow.pyfunc.load_model('models:/diabetes-onnx@champion').predict(pd.read_csv('diabetes.csv'))\n"
        "print(json.dumps({'regression': r['prediction'].tolist(), 'team': t['prediction'].tolist(), 'columns': "
        "list(t.columns),\n"
        "                  'onnx': o['prediction'].tolist(), 'onnx_columns': list(o.columns)}))\n"
    )
    proc = _in_fresh_env(fresh_env, code, mlflow_server, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    regression_dir = next(registered["regression_ws"].rglob("train-model/model"))
    mine = loader.load(regression_dir).predict_frame(rows)["prediction"].to_numpy()
    assert max(abs(a - b) for a, b in zip(out["regression"], mine, strict=True)) < 1e-4
    # the optimized variant (whichever was fastest within 0.01 of r2): the same frame, close predictions
    std = float(pd.read_csv(diabetes_csv)["target"].std())
    assert (
        out["onnx_columns"] == ["prediction"]
        and sum(abs(a - b) for a, b in zip(out["onnx"], mine, strict=True)) / len(mine) < 0.05 * std
    )
    monkeypatch.syspath_prepend(
        TEAM["PYTHONPATH"]
    )  # trainpipe's own load, here, imports the team's code from its package
    team = loader.load(registered["team_model"], trusted=lambda m: m == "teampkg.models").predict_frame(digits)
    assert out["team"] == team["prediction"].tolist()
    assert out["columns"] == ["prediction"] + [f"probability_{c}" for c in range(10)]


def test_the_registered_model_is_served_over_rest(fresh_env, registered, mlflow_server, diabetes_csv, tmp_path):
    import pandas as pd

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"MLFLOW_TRACKING_URI": mlflow_server, "PATH": f"{fresh_env / 'bin'}:{os.environ['PATH']}"})
    server = subprocess.Popen(
        [
            str(fresh_env / "bin" / "mlflow"),
            "models",
            "serve",
            "-m",
            "models:/diabetes@champion",
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=tmp_path,
        env=env,
        stdout=open(tmp_path / "serve.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/ping", server, tmp_path / "serve.log", 180)
        rows = pd.read_csv(diabetes_csv).drop(columns=["target"]).head(5)
        body = json.dumps({"dataframe_split": rows.to_dict(orient="split", index=False)}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            served = json.loads(r.read())["predictions"]
        from trainpipe.services.serving import loader

        mine = (
            loader.load(next(registered["regression_ws"].rglob("train-model/model")))
            .predict_frame(rows)["prediction"]
            .tolist()
        )
        assert [round(p["prediction"], 4) for p in served] == [round(v, 4) for v in mine]
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have died already: its log is in the assertion
            os.killpg(server.pid, 15)
        server.wait(timeout=30)
