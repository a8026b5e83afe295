"""DAG integrity, in Airflow's own style: the DAG file parses with no import errors, without
touching the metadata database or looking up a connection, and every task carries retries
with a capped exponential backoff, a timeout and documentation."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.contract

PARSE_GUARDED = """
import sqlalchemy.engine, sqlalchemy.orm
from airflow.models.connection import Connection

def refuse(what):
    def _f(*a, **k):
        raise AssertionError(f"{{what}} while parsing the DAG file")
    return _f

sqlalchemy.engine.Engine.connect = refuse("a database connection")
sqlalchemy.orm.Session.execute = refuse("a database query")
Connection.get_connection_from_secrets = classmethod(refuse("a connection lookup"))
from airflow.sdk.bases.hook import BaseHook
BaseHook.get_connection = classmethod(refuse("a connection lookup"))

import importlib.util
spec = importlib.util.spec_from_file_location("training_dag", {path!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
dag = mod.dag
print("parsed", dag.dag_id, len(dag.tasks))
for t in dag.tasks:
    assert t.doc_md, f"{{t.task_id}} has no doc_md"
    assert t.execution_timeout is not None, f"{{t.task_id}} has no execution_timeout"
    if t.task_id not in ("validate_data", "gate"):
        assert t.retries >= 1 and t.retry_exponential_backoff and t.max_retry_delay is not None, t.task_id
assert dag.doc_md and dag.max_active_runs == 1 and dag.catchup is False
print("ok")
"""


@pytest.mark.parametrize("mode", ["local", "kubernetes"])
def test_dag_parses_without_database_or_connections(tmp_path, mode):
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # an unreachable database: parsing must not need one
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "sqlite:////nonexistent-trainpipe-dir/airflow.db",
        "TRAINPIPE_AIRFLOW_MODE": mode,
    }
    code = PARSE_GUARDED.format(path=str(REPO / "dags" / "training_dag.py"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ok"


def test_the_guard_would_catch_a_lookup(tmp_path):
    dag_file = tmp_path / "bad_dag.py"
    dag_file.write_text(
        "from airflow.sdk.bases.hook import BaseHook\n"
        "BaseHook.get_connection('mlflow')\n"
        "dag = None\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = subprocess.run([sys.executable, "-c", PARSE_GUARDED.format(path=str(dag_file))], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode != 0 and "a connection lookup while parsing the DAG file" in proc.stderr
