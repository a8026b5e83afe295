"""The training DAG with require_approval on Airflow's CeleryExecutor, as dags/celery.env deploys it:
this machine's Redis as the broker, PostgreSQL as the metadata database and the result backend, an
api-server, a scheduler, a dag-processor and three Celery workers: one serving the ``default``
queue (every step but training) and two serving ``train`` (the hardware profile's train queue).

Three runs, triggered and answered through the REST API as people would:
1. approved: train_model ran on a train worker and every other step on the steps worker; the
   approval moved the serving alias, the version carries the approver and the audit log says so;
2. the train worker running train_model is killed (the whole machine: worker, task runner,
   torchrun): the scheduler notices the silence, the task is retried on the other train worker,
   the run registers its version once; a person rejects it: nothing moves;
3. nobody answers: the approval times out to its default (Reject): nothing moves.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, _free_port, fresh_postgres_db, psycopg2_url
from tests.helpers.airflow_api import Api, _wait, serving, start, stop

pytestmark = pytest.mark.integration

DAG_ID = "trainpipe_training"
MODEL = "celery-digits"
WORKERS = {"steps-worker": "default", "train-worker-1": "train", "train-worker-2": "train"}


def _deployment_env() -> dict[str, str]:
    """dags/celery.env, as a deployment loads it."""
    env = {}
    for line in (REPO / "dags" / "celery.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and everything under it: a machine that went away."""
    import psutil

    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def test_celery_workers_by_queue_approval_rejection_timeout_and_a_killed_worker(tmp_path, digits_csv, mlflow_server):
    """Slow on purpose (about 4-5 minutes on 2 cores): it is a whole CeleryExecutor deployment (api-server,
    scheduler, dag-processor, three Celery workers on Redis and PostgreSQL) running three DAG runs end to end,
    one of which waits out the scheduler's detection of a killed worker and one the approval's timeout; each
    is the behaviour under test, and no smaller deployment shows a task moving between workers."""
    import mlflow
    import redis

    home, logs, dags = tmp_path / "airflow", tmp_path / "logs", tmp_path / "dags"
    for d in (home, logs, dags):
        d.mkdir()
    shutil.copy(REPO / "dags" / "training_dag.py", dags / "training_dag.py")
    audit_log = tmp_path / "audit" / "audit.jsonl"
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": str(digits_csv),
                "workspace": str(tmp_path / "ws"),
                "dataset_name": "digits",
                "model_name": MODEL,
                "tracking_uri": mlflow_server,
                "thresholds": {"accuracy": 0.5},
                "max_regression": {"accuracy": 0.5},
                "train": {"nproc_per_node": 1, "epochs": 2, "batch_size": 64},
                "schedule": None,
                "require_approval": True,
                "approval_timeout_hours": 0.02,  # 72 s: the third run waits it out
            }
        )
    )
    broker_db = 11  # Redis keeps nothing on disk; this test's broker database is emptied first
    redis.Redis(host="127.0.0.1", port=6379, db=broker_db).flushdb()
    api_port = _free_port()
    password = secrets.token_urlsafe(12)
    (home / "passwords.json").write_text(json.dumps({"ci": password}))
    with fresh_postgres_db("trainpipe_celery") as db:
        env = {
            **os.environ,
            **_deployment_env(),
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:6379/{broker_db}",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://postgres@127.0.0.1:5432/{db}",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",  # the killed worker's task is retried sooner
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": psycopg2_url(db),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "ci:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "tests.helpers.worker_name.hostname",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "TRAINPIPE_CONFIG": str(config),
            "TRAINPIPE_AIRFLOW_MODE": "local",
            "TRAINPIPE_AUDIT_LOG": str(audit_log),
        }
        env.pop("MLFLOW_TRACKING_URI", None)
        airflow = [sys.executable, "-m", "airflow"]
        migrate = subprocess.run(
            [*airflow, "db", "migrate"], env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert migrate.returncode == 0, migrate.stderr[-3000:]
        procs: dict[str, subprocess.Popen] = {}

        try:
            start(
                airflow, "api-server", ["api-server", "--port", str(api_port), "--host", "127.0.0.1"], env, logs, procs
            )
            start(airflow, "scheduler", ["scheduler"], env, logs, procs)
            start(airflow, "dag-processor", ["dag-processor"], env, logs, procs)
            for name, queue in WORKERS.items():
                start(
                    airflow,
                    name,
                    ["celery", "worker", "--queues", queue, "--celery-hostname", f"{name}@%h", "--concurrency", "2"],
                    {**env, "TRAINPIPE_TEST_WORKER": name},
                    logs,
                    procs,
                )
            api = Api(f"http://127.0.0.1:{api_port}")
            serving(api, procs, logs, "ci", password, DAG_ID)
            from trainpipe.pipelines.config import load_pipeline_config

            train_param = load_pipeline_config(config).train.model_dump(
                mode="json"
            )  # a run's conf replaces the whole dict
            client = mlflow.MlflowClient(mlflow_server)

            def trigger(seed: int) -> str:
                run = api.call(
                    "POST",
                    f"/api/v2/dags/{DAG_ID}/dagRuns",
                    {"logical_date": None, "conf": {"train": {**train_param, "seed": seed}}},
                )
                return f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}"

            def ti(path: str, task: str) -> dict:
                return api.call("GET", f"{path}/taskInstances/{task}")

            def awaiting(path: str) -> dict:
                def check():
                    t = ti(path, "approve")
                    if t["state"] in ("failed", "upstream_failed", "skipped"):
                        pytest.fail(f"approve is {t['state']}: {api.call('GET', f'{path}/taskInstances')}")
                    return t if t["state"] in ("awaiting_input", "deferred") else None

                return _wait("the approval to wait for a person", check, 600, procs, logs, every=2)

            def answer(path: str, option: str, reason: str) -> dict:
                return api.call(
                    "PATCH",
                    f"{path}/taskInstances/approve/-1/hitlDetails",
                    {"chosen_options": [option], "params_input": {"reason": reason}},
                )

            def finished(path: str) -> dict[str, dict]:
                def check():
                    state = api.call("GET", path)["state"]
                    return state if state in ("success", "failed") else None

                assert _wait("the run to finish", check, 600, procs, logs, every=3) == "success", api.call(
                    "GET", f"{path}/taskInstances"
                )
                return {t["task_id"]: t for t in api.call("GET", f"{path}/taskInstances")["task_instances"]}

            def champion() -> str | None:
                from trainpipe.services import registry

                mv = registry.alias_version(client, MODEL, "champion")
                return None if mv is None else str(mv.version)

            # 1. approved: the alias moves; train_model on a train worker, every other step on the steps worker
            run1 = trigger(1)
            awaiting(run1)
            assert champion() is None  # registered as challenger only, waiting
            answer(run1, "Approve", "reviewed the model card")
            tis = finished(run1)
            assert tis["train_model"]["hostname"].startswith("train-worker-") and tis["train_model"]["queue"] == "train"
            ran = {
                k: v["hostname"]
                for k, v in tis.items()
                if v["state"] == "success" and k not in ("train_model", "approve", "gate", "retrain")
            }
            assert set(ran.values()) == {"steps-worker"}, ran
            assert tis["promote_model"]["state"] == "success" and tis["record_rejection"]["state"] == "skipped"
            v1 = _xcom(api, run1, "register_model")["version"]
            assert champion() == v1
            tags = client.get_model_version(MODEL, v1).tags
            assert tags["trainpipe.approval.decision"] == "approved" and tags["trainpipe.approval.by"] == "ci"
            assert tags["trainpipe.approval.reason"] == "reviewed the model card"

            # 2. the train worker running train_model dies; the other train worker runs the retry; a person rejects
            run2 = trigger(2)

            def training_on():
                t = ti(run2, "train_model")
                return t if t["state"] == "running" and t["hostname"] in WORKERS else None

            first = _wait("train_model to start", training_on, 600, procs, logs, every=1)["hostname"]
            runs = tmp_path / "ws" / "airflow-runs"  # the ranks' settings exist while they train: kill it there
            _wait(
                "its ranks to start",
                lambda: list(runs.glob("*/train_model/.train_config.node*.json")),
                600,
                procs,
                logs,
            )
            _kill_tree(procs.pop(first).pid)
            awaiting(run2)
            answer(run2, "Reject", "not this one")
            tis = finished(run2)
            tries = sorted(
                api.call("GET", f"{run2}/taskInstances/train_model/tries")["task_instances"],
                key=lambda t: t["try_number"],
            )
            assert tries[0]["hostname"] == first and tries[-1]["state"] == "success", tries
            assert tries[-1]["hostname"].startswith("train-worker-") and tries[-1]["hostname"] != first, tries
            assert tis["register_model"]["try_number"] == 1 and tis["promote_model"]["state"] == "skipped"
            assert tis["record_rejection"]["state"] == "success"
            v2 = _xcom(api, run2, "register_model")["version"]
            assert (
                int(v2) == int(v1) + 1 and len(client.search_model_versions(f"name = '{MODEL}'")) == 2
            )  # registered once
            assert champion() == v1
            tags = client.get_model_version(MODEL, v2).tags
            assert tags["trainpipe.approval.decision"] == "rejected" and tags["trainpipe.approval.by"] == "ci"

            # 3. nobody answers: rejected by default when the timeout passes
            run3 = trigger(3)
            awaiting(run3)
            tis = finished(run3)
            assert tis["promote_model"]["state"] == "skipped" and tis["record_rejection"]["state"] == "success"
            v3 = _xcom(api, run3, "register_model")["version"]
            assert champion() == v1
            tags = client.get_model_version(MODEL, v3).tags
            assert tags["trainpipe.approval.decision"] == "rejected" and "timed out" in tags["trainpipe.approval.by"]

            records = [json.loads(line) for line in audit_log.read_text().splitlines()]
            decisions = [
                (r["action"], r["decision"]["version"], r["who"]["identity"])
                for r in records
                if r["action"] in ("promote", "reject")
            ]
            assert decisions == [
                ("promote", v1, "ci"),
                ("reject", v2, "ci"),
                ("reject", v3, "airflow: no answer before the approval timed out"),
            ], decisions
            verify = subprocess.run(
                [sys.executable, "-m", "trainpipe.app.cli", "audit", "verify", str(audit_log)],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
            )
            assert verify.returncode == 0, verify.stderr
        finally:
            stop(procs)


def _xcom(api: Api, path: str, task: str) -> dict:
    xcom = api.call("GET", f"{path}/taskInstances/{task}/xcomEntries/return_value")
    return xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
