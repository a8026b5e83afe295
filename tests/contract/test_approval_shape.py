"""require_approval's shape, offline: the compiled KFP pipeline registers the challenger only (a
constant, not a run parameter), and both DAGs wait on Airflow's ApprovalOperator between
register_model and the alias move, rejecting by default when the timeout passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.contract

SHAPE = """
import importlib.util, json
spec = importlib.util.spec_from_file_location("dag", {path!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
out = {{}}
for t in mod.dag.tasks:
    timeout = getattr(t, "response_timeout", None)
    out[t.task_id] = {{
        "type": type(t).__name__, "mro": [c.__name__ for c in type(t).__mro__], "down": sorted(t.downstream_task_ids),
        "trigger_rule": getattr(t.trigger_rule, "value", t.trigger_rule), "queue": t.queue,
        "settings": getattr(t, "settings", None), "defaults": getattr(t, "defaults", None),
        "timeout_s": timeout.total_seconds() if timeout else None,
        "reject": getattr(t, "reject", None), "params": sorted(getattr(t, "params", {{}}) or {{}})}}
print(json.dumps(out, default=str))
"""


def _register_inputs(path) -> dict:
    """register-model's task inputs, wherever the gate's condition nests it."""
    docs = list(yaml.safe_load_all(path.read_text()))
    found = {}

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "register-model" and isinstance(value, dict) and "inputs" in value:
                    found.update(value["inputs"].get("parameters", {}))
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(docs[0])
    return found


def test_the_compiled_pipeline_registers_the_challenger_only_under_require_approval(tmp_path):
    from trainpipe.pipelines.compile import compile_pipeline, validate_pipeline_yaml

    approved = compile_pipeline(tmp_path / "approval.yaml", "cpu", require_approval=True)
    validate_pipeline_yaml(approved)
    plain = compile_pipeline(tmp_path / "plain.yaml", "cpu")
    assert _register_inputs(approved)["move_alias"] == {"runtimeValue": {"constant": False}}
    assert _register_inputs(plain)["move_alias"] == {"runtimeValue": {"constant": True}}
    params = list(yaml.safe_load_all(approved.read_text()))[0]["root"]["inputDefinitions"]["parameters"]
    assert not {"move_alias", "require_approval"} & set(params)  # a run's parameters cannot skip the approval


@pytest.mark.parametrize("dag_file", ["training_dag.py", "retrain_dag.py"])
def test_the_dags_wait_for_airflows_approval_between_registration_and_the_alias_move(tmp_path, dag_file):
    cfg = tmp_path / "pipeline.yaml"
    shapes = {}
    for approval in (True, False):
        cfg.write_text(yaml.safe_dump({"data": "data.csv", "require_approval": approval, "approval_timeout_hours": 2}))
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(tmp_path),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "TRAINPIPE_CONFIG": str(cfg),
        }
        proc = subprocess.run(
            [sys.executable, "-c", SHAPE.format(path=str(REPO / "dags" / dag_file))],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        shapes[approval] = json.loads(proc.stdout.strip().splitlines()[-1])
    on, off = shapes[True], shapes[False]
    assert (
        not {"approve", "promote_model", "record_rejection"} & set(off)
        and "move_alias" not in off["register_model"]["settings"]
    )
    assert on["register_model"]["settings"]["move_alias"] is False and on["register_model"]["down"] == ["approve"]
    approve = on["approve"]
    assert "ApprovalOperator" in approve["mro"] and approve["defaults"] == ["Reject"] and approve["timeout_s"] == 7200
    assert approve["params"] == ["reason"] and approve["down"] == ["promote_model"]
    assert on["promote_model"]["down"] == ["record_rejection"] and on["promote_model"]["reject"] is False
    assert on["record_rejection"]["trigger_rule"] == "all_skipped" and on["record_rejection"]["reject"] is True
    assert on["train_model"]["queue"] == "train" and {t["queue"] for k, t in on.items() if k != "train_model"} == {
        "default"
    }
