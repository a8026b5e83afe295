"""The README's first command, for real: ``trainpipe demo`` trains and registers a model that MLflow loads.

``make demo`` is ``trainpipe demo --engine kfp-local``; CI also runs it as written (.ci/run). Here the demo
runs in a scratch folder (its default workspace, ``.trainpipe/demo``, is relative to where it starts) once
on kfp-local with the default profile, and once through Airflow's ``dag.test()`` with ``--profile cpu-smb``
(``make demo-smb``'s profile), so each engine and each profile the README names trains once. Each test reads
what the demo's last lines promise: a model version under its alias that ``mlflow.pyfunc.load_model``
loads and predicts with.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

TRAINPIPE = str(Path(sys.executable).parent / "trainpipe")
#: What a user's shell would not carry into a first run: a config or a store of another test.
FOREIGN = ("TRAINPIPE_CONFIG", "MLFLOW_TRACKING_URI", "TRAINPIPE_WORKSPACE", "TRAINPIPE_DRY_RUN", "TRAINPIPE_POLICY")


def _demo(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN}
    return subprocess.run(
        [TRAINPIPE, "demo", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )


def _promised(out: str) -> dict[str, str]:
    """The summary's lines a user acts on: the registered model and where MLflow keeps it."""
    reg = re.search(r"^registered model : (\S+) version (\d+) alias @(\S+) \(new\)$", out, re.M)
    uri = re.search(r"^MLflow tracking  : (\S+)$", out, re.M)
    assert reg and uri, out[-3000:]
    return {"name": reg.group(1), "version": reg.group(2), "alias": reg.group(3), "tracking_uri": uri.group(1)}


def _load_and_predict(promised: dict[str, str], model_uri: str | None = None) -> None:
    import mlflow
    from sklearn.datasets import load_digits

    mlflow.set_tracking_uri(promised["tracking_uri"])
    client = mlflow.MlflowClient()
    held = client.get_model_version_by_alias(promised["name"], promised["alias"])
    assert str(held.version) == promised["version"]
    model = mlflow.pyfunc.load_model(model_uri or f"models:/{promised['name']}@{promised['alias']}")
    digits = load_digits(as_frame=True).frame.rename(columns={"target": "label"})
    rows = digits.drop(columns=["label"]).head(50)
    predicted = model.predict(rows)  # the class and each class's probability, a column each
    labels = predicted["prediction"].to_numpy()
    assert len(labels) == 50
    accuracy = float((labels == digits["label"].head(50).to_numpy()).mean())
    assert accuracy > 0.8, f"the demo's registered model predicts {accuracy:.2f} of 50 training digits right"


def test_make_demo_trains_registers_and_the_model_loads(tmp_path):
    """The demo is the whole reference pipeline on 1,797 rows with two ranks (about a minute on two cores):
    the README's first command, run as a user runs it."""
    proc = _demo(tmp_path, "--engine", "kfp-local")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "dry run" not in proc.stdout
    assert "trainpipe: pipeline finished (engine kfp-local)" in proc.stdout
    promised = _promised(proc.stdout)
    assert promised["name"] == "trainpipe-digits"
    assert (tmp_path / ".trainpipe" / "demo" / "pipeline.yaml").is_file()
    _load_and_predict(promised)


def test_demo_on_airflow_with_the_smb_profile_trains_and_registers_both_models(tmp_path):
    """``trainpipe demo --engine airflow-local --profile cpu-smb`` (``make demo-smb``'s profile, under Airflow's
    ``dag.test()``): the pipeline, and optimize_model's ONNX variant, for real (about two minutes)."""
    proc = _demo(tmp_path, "--engine", "airflow-local", "--profile", "cpu-smb", "--workspace", "ws")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "dry run" not in proc.stdout
    assert "trainpipe: pipeline finished (engine airflow-local)" in proc.stdout
    promised = _promised(proc.stdout)
    _load_and_predict(promised)
    optimized = re.search(r"^optimized model  : (\S+) ", proc.stdout, re.M)
    assert optimized, proc.stdout[-3000:]
    _load_and_predict(promised, model_uri=optimized.group(1))
