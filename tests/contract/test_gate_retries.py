"""Gates retry nothing (issue 53 §5): a gate's decision is data, the same on every try, so a retry only delays
the skip. On Airflow each gate task (GateOperator) has retries 0 whatever the profile gives the steps; on KFP
a gate is a ``dsl.If`` condition, which carries no retry policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.contract

GATES = """
import importlib.util, json
from trainpipe.faces.airflow_operator import GateOperator
out = {}
for name in ("training_dag", "retrain_dag"):
    spec = importlib.util.spec_from_file_location(name, DAGS + "/" + name + ".py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out[name] = {t.task_id: t.retries for t in mod.dag.tasks if isinstance(t, GateOperator)}
    out[name + ":steps"] = min(t.retries for t in mod.dag.tasks if not isinstance(t, GateOperator))
print(json.dumps(out))
"""


def test_airflow_gates_retry_nothing_while_the_steps_do(tmp_path):
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"data: {tmp_path / 'data.csv'}\n")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "TRAINPIPE_CONFIG": str(config)}
    proc = subprocess.run(
        [sys.executable, "-c", GATES.replace("DAGS", repr(str(REPO / "dags")))], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["training_dag"]["gate"] == 0 and set(found["training_dag"].values()) == {0}
    assert found["retrain_dag"] and set(found["retrain_dag"].values()) == {0}
    assert found["training_dag:steps"] >= 1  # the profile's retries still reach the steps


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_kfp_gates_are_conditions_without_a_retry_policy(profile):
    ir = next(yaml.safe_load_all((REPO / "pipelines" / "golden" / f"pipeline-{profile}.yaml").read_text()))
    conditions = []
    for comp in [ir["root"], *ir["components"].values()]:
        for name, task in comp.get("dag", {}).get("tasks", {}).items():
            if "condition" in json.dumps(task.get("triggerPolicy", {})) and name.startswith("condition-"):
                conditions.append(name)
                assert "retryPolicy" not in task, name
    assert conditions
