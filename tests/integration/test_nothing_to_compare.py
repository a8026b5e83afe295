"""A step with no champion to compare with says so without MLflow's import (issue 57 §1): on a local SQLite store
the alias table is read with the standard library, and only a certain "none" is answered there; MLflow is asked
whenever the store holds the alias, so the fast answer never hides a champion MLflow would find."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainpipe.contract.runtime import Runtime
from trainpipe.services import registry

pytestmark = pytest.mark.integration


def test_the_gate_with_no_store_yet_answers_none_without_importing_mlflow(tmp_path):
    code = f"""
import json, sys
from trainpipe.services import registry
from trainpipe.contract.runtime import Runtime
found = registry.champion("sqlite:///{tmp_path}/mlflow.db", "digits", "champion", Runtime())
print(json.dumps([found is None, "mlflow" in sys.modules]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [True, False]
    assert not (tmp_path / "mlflow.db").exists()  # asking made no store


def test_a_store_in_a_missing_folder_is_left_to_mlflow(tmp_path):
    assert not registry.no_alias_in_sqlite_store(f"sqlite:///{tmp_path}/nowhere/mlflow.db", "digits", "champion")


def test_the_fast_answer_agrees_with_mlflow_on_a_real_store(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri()))
    client.create_registered_model("served")
    version = client.create_model_version("served", f"runs:/{run.info.run_id}/model", run.info.run_id)
    client.set_registered_model_alias("served", "champion", version.version)
    client.create_registered_model("unaliased")
    client.create_model_version("unaliased", f"runs:/{run.info.run_id}/model", run.info.run_id)
    cases = [("served", "champion"), ("served", "production"), ("unaliased", "champion"), ("absent", "champion")]
    for name, alias in cases:
        fast_none = registry.no_alias_in_sqlite_store(uri, name, alias)
        mlflow_none = registry.alias_version(client, name, alias) is None
        assert fast_none == mlflow_none, (name, alias)
        found = registry.champion(uri, name, alias, Runtime())
        assert (found is None) == mlflow_none and (found is None or found.number == str(version.version))


def test_a_file_that_is_not_a_store_is_left_to_mlflow(tmp_path):
    path = Path(tmp_path / "mlflow.db")
    path.write_text("not a database")
    assert not registry.no_alias_in_sqlite_store(f"sqlite:///{path}", "digits", "champion")
