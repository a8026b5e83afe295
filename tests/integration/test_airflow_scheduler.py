"""The training DAG on a real Airflow 3 deployment: api-server, scheduler and dag-processor
processes, PostgreSQL as the metadata database, LocalExecutor. The run is triggered through
the REST API as a user would, with the MLflow tracking server down at first: detect_drift (the
first step that reads MLflow) exits 75 (transient), Airflow retries it with backoff, the server
comes up, and the run succeeds; train_model, preempted twice, runs again in its first try (no retry
spent). The ingest DAG is triggered at the same moment: both snapshot into one DVC repository, and
both land, the repository clean and no raw data in git. Then the retraining DAG, on asset events posted
through the API: a new snapshot of the same data does not retrain (the retrain task says why, and names
each other event of its batch with why it was skipped), a drifted one does.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, _free_port, _start_mlflow, fresh_postgres_db, psycopg2_url
from tests.helpers.airflow_api import Api, _wait, serving, start, stop

pytestmark = pytest.mark.integration

DAG_ID = "trainpipe_training"
RETRAIN_ID = "trainpipe_retrain_on_new_data"
INGEST_ID = "trainpipe_ingest_new_data"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _repo_is_clean(repo: Path) -> None:
    """What two snapshots at once must leave: nothing uncommitted, and git holding DVC's records, not the data."""
    assert _git(repo, "status", "--porcelain") == "", _git(repo, "status")
    tracked = _git(repo, "ls-files").split()
    assert "data/digits/digits.csv.dvc" in tracked and not [f for f in tracked if f.endswith(".csv")], tracked


def _drifted_snapshot(tmp_path: Path, digits_csv: Path, ws: Path) -> str:
    """A snapshot of the digits with two features moved, in the workspace's DVC repo and remote
    (as the training DAG's snapshot_dataset would make it): what the retraining DAG is told about."""
    import pandas as pd

    from tests.conftest import result_of, run_component

    frame = pd.read_csv(digits_csv)
    frame["pixel_2_3"] = frame["pixel_2_3"] + 4
    frame["pixel_3_4"] = frame["pixel_3_4"] * 1.8
    (tmp_path / "moved").mkdir()
    frame.to_csv(tmp_path / "moved" / "digits.csv", index=False)  # a new version of the same file of the dataset
    result_of(
        run_component(
            "validate_data", "--data", str(tmp_path / "moved" / "digits.csv"), "--output-dir", str(tmp_path / "moved-v")
        )
    )
    result_of(
        run_component(
            "snapshot_dataset",
            "--data",
            str(tmp_path / "moved-v"),
            "--repo-dir",
            str(ws / "dvc-repo"),
            "--remote-url",
            str(ws / "dvc-remote"),
            "--dataset-name",
            "digits",
            "--output-dir",
            str(tmp_path / "moved-s"),
        )
    )
    return str(tmp_path / "moved-s")


@pytest.fixture
def postgres_db():
    """A fresh PostgreSQL database for Airflow's metadata, dropped afterwards."""
    with fresh_postgres_db("trainpipe_airflow") as db:
        yield psycopg2_url(db)


def test_training_dag_on_a_real_scheduler_retries_a_transient_failure(tmp_path, digits_csv, postgres_db):
    """Slow on purpose (about 2 minutes): a real scheduler, dag-processor and api-server run the training DAG,
    including the retry's backoff while MLflow is down (the behaviour under test), with the ingest DAG beside it
    (its two tasks run during that backoff), then two retraining runs triggered by asset events; the
    scheduler's own loop sets the pace, not the steps."""
    home, logs, dags = tmp_path / "airflow", tmp_path / "logs", tmp_path / "dags"
    for d in (home, logs, dags):
        d.mkdir()
    for f in ("training_dag.py", "retrain_dag.py", "ingest_dag.py"):
        shutil.copy(REPO / "dags" / f, dags / f)
    mlflow_port, api_port = _free_port(), _free_port()
    tracking_uri = f"http://127.0.0.1:{mlflow_port}"  # nothing listens yet: the tracking server is down
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": str(digits_csv),
                "workspace": str(tmp_path / "ws"),
                "dataset_name": "digits",
                "model_name": "scheduler-digits",
                "tracking_uri": tracking_uri,
                "thresholds": {"accuracy": 0.85},
                "train": {"nproc_per_node": 1, "epochs": 3, "batch_size": 64},
                "schedule": None,
                "drift_share": 0.02,  # the data set drifted when 2 of its 65 columns did
            }
        )
    )
    password = secrets.token_urlsafe(12)
    (home / "passwords.json").write_text(json.dumps({"ci": password}))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_db,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "ci:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),  # shared by every process of the deployment
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "TRAINPIPE_CONFIG": str(config),
        "TRAINPIPE_AIRFLOW_MODE": "local",
        "TRAINPIPE_FAULT": "preempt:3:2",  # train_model is preempted twice in its first try (a checkpoint each time)
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    airflow = [sys.executable, "-m", "airflow"]
    migrate = subprocess.run(
        [*airflow, "db", "migrate"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]

    procs: dict[str, subprocess.Popen] = {}
    mlflow_gen = None
    try:
        for name, args in {
            "api-server": ["api-server", "--port", str(api_port), "--host", "127.0.0.1"],
            "scheduler": ["scheduler", "--skip-serve-logs"],  # its log server would bind 0.0.0.0
            "dag-processor": ["dag-processor"],
        }.items():
            start(airflow, name, args, env, logs, procs)
        api = Api(f"http://127.0.0.1:{api_port}")
        dag = serving(api, procs, logs, "ci", password, DAG_ID)
        assert dag["is_paused"] is True  # new DAGs start paused (dags_are_paused_at_creation)
        serving(api, procs, logs, "ci", password, INGEST_ID)
        # an override of one nested setting: the config's 3 epochs become 2, every other train setting stays
        # an unknown setting: the run's first task fails, not retried, in one line (Airflow's trigger would dump
        # the schema); the good run waits for it (max_active_runs=1), a few seconds
        bad = api.call(
            "POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"train": {"epoch": 2}}}
        )
        bad_path = f"/api/v2/dags/{DAG_ID}/dagRuns/{bad['dag_run_id']}"

        def bad_done():
            state = api.call("GET", bad_path)["state"]
            return state if state in ("success", "failed") else None

        assert _wait("the run with a misspelt setting to fail", bad_done, 180, procs, logs) == "failed"
        log = json.dumps(api.call("GET", f"{bad_path}/taskInstances/validate_data/logs/1?full_content=true"))
        assert "conf: train: 'epoch' is not a train setting (its settings: " in log, log[-3000:]
        assert api.call("GET", f"{bad_path}/taskInstances/validate_data")["try_number"] == 1
        # the ingest DAG and the training DAG at the same moment: both snapshot the dataset into one DVC repo
        ingest = api.call("POST", f"/api/v2/dags/{INGEST_ID}/dagRuns", {"logical_date": None})
        run = api.call(
            "POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"train": {"epochs": 2}}}
        )
        ingest_path = f"/api/v2/dags/{INGEST_ID}/dagRuns/{ingest['dag_run_id']}"
        run_path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}"

        def drift_state():
            ti = api.call("GET", f"{run_path}/taskInstances/detect_drift")
            return ti if ti["state"] in ("up_for_retry", "failed", "upstream_failed", "success") else None

        ti = _wait("detect_drift's first attempt", drift_state, 420, procs, logs)
        assert ti["state"] == "up_for_retry", ti  # exit 75: transient, retried; never failed for good
        mlflow_gen = _start_mlflow(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", port=mlflow_port)
        assert next(mlflow_gen) == tracking_uri

        def finished():
            state = api.call("GET", run_path)["state"]
            return state if state in ("success", "failed") else None

        assert _wait("the DAG run to finish", finished, 900, procs, logs, every=5) == "success", api.call(
            "GET", f"{run_path}/taskInstances"
        )
        tis = {t["task_id"]: t for t in api.call("GET", f"{run_path}/taskInstances")["task_instances"]}
        assert {k: v["state"] for k, v in tis.items()} == dict.fromkeys(
            [
                "validate_data",
                "snapshot_dataset",
                "detect_drift",
                "retrain",
                "train_model",
                "profile_training",
                "evaluate_model",
                "gate",
                "register_model",
            ],
            "success",
        )
        assert tis["detect_drift"]["try_number"] >= 2 and tis["validate_data"]["try_number"] == 1
        # two preemptions spent no retry: train_model ran again in its first try, resuming from its checkpoint
        assert tis["train_model"]["try_number"] == 1, tis["train_model"]
        log = json.dumps(api.call("GET", f"{run_path}/taskInstances/train_model/logs/1?full_content=true"))
        assert "preemption 1 of at most 3" in log and "preemption 2 of at most 3" in log, log[-3000:]
        assert "resumes from ckpt-" in log and "Traceback" not in log, log[-3000:]
        tries = api.call("GET", f"{run_path}/taskInstances/detect_drift/tries")["task_instances"]
        states = [t["state"] for t in sorted(tries, key=lambda t: t["try_number"])]
        assert states[0] == "failed" and states[-1] == "success", states  # the history of a retried task
        xcom = api.call("GET", f"{run_path}/taskInstances/register_model/xcomEntries/return_value")
        result = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
        assert result["model_name"] == "scheduler-digits" and str(result["version"]) == "1"
        assert result["lineage"]["orchestrator"] == {"name": "airflow", "run_id": run["dag_run_id"]}
        trained = api.call("GET", f"{run_path}/taskInstances/train_model/xcomEntries/return_value")["value"]
        trained = trained if isinstance(trained, dict) else json.loads(trained)
        assert trained["epochs"] == 2, trained  # the run's override; batch_size etc. from the config

        # the ingest run, triggered with the training run, long done (its two tasks ran during the backoff)
        def ingested():
            state = api.call("GET", ingest_path)["state"]
            return state if state in ("success", "failed") else None

        assert _wait("the ingest run to finish", ingested, 300, procs, logs) == "success", api.call(
            "GET", f"{ingest_path}/taskInstances"
        )
        ingest_tis = {t["task_id"]: t for t in api.call("GET", f"{ingest_path}/taskInstances")["task_instances"]}
        assert {k: v["state"] for k, v in ingest_tis.items()} == dict.fromkeys(
            ["validate_data", "snapshot_dataset"], "success"
        )
        # one writer at a time: of the same bytes snapshotted twice, whichever went first committed them
        committed = {}
        for name, path in (("training", run_path), ("ingest", ingest_path)):
            xcom = api.call("GET", f"{path}/taskInstances/snapshot_dataset/xcomEntries/return_value")["value"]
            committed[name] = bool((xcom if isinstance(xcom, dict) else json.loads(xcom))["committed"])
        assert sorted(committed.values()) == [False, True], committed
        ws = tmp_path / "ws"
        _repo_is_clean(ws / "dvc-repo")

        # the retraining DAG, on new snapshots: the same data again, then a drifted copy
        def snapshot_of(dag_run_id: str) -> str:
            folder = ws / "airflow-runs" / dag_run_id.replace(":", "_").replace("+", "_") / "snapshot_dataset"
            assert folder.is_dir(), sorted(p.name for p in (ws / "airflow-runs").iterdir())
            return str(folder)

        same, ingested_dir = snapshot_of(run["dag_run_id"]), snapshot_of(ingest["dag_run_id"])
        moved = _drifted_snapshot(tmp_path, digits_csv, ws)  # a later snapshot into the same repo still works
        _repo_is_clean(ws / "dvc-repo")
        asset = api.call("GET", "/api/v2/assets?uri_pattern=trainpipe%3A%2F%2Fdatasets%2Fdigits")["assets"][0]
        api.call("PATCH", f"/api/v2/dags/{RETRAIN_ID}", {"is_paused": False})

        def retrain_run(snapshot: str) -> dict:
            before = {r["dag_run_id"] for r in api.call("GET", f"/api/v2/dags/{RETRAIN_ID}/dagRuns")["dag_runs"]}
            api.call(
                "POST",
                "/api/v2/assets/events",
                {"asset_id": asset["id"], "extra": {"changed": True, "snapshot_dir": snapshot, "md5": "new"}},
            )

            def started():
                new = [
                    r
                    for r in api.call("GET", f"/api/v2/dags/{RETRAIN_ID}/dagRuns")["dag_runs"]
                    if r["dag_run_id"] not in before
                ]
                return new[0] if new else None

            run = _wait("a retraining run", started, 120, procs, logs)
            path = f"/api/v2/dags/{RETRAIN_ID}/dagRuns/{run['dag_run_id']}"

            def done():
                state = api.call("GET", path)["state"]
                return state if state in ("success", "failed") else None

            assert _wait("the retraining run to finish", done, 600, procs, logs, every=3) == "success", api.call(
                "GET", f"{path}/taskInstances"
            )
            return {t["task_id"]: t for t in api.call("GET", f"{path}/taskInstances")["task_instances"]} | {
                "_path": path
            }

        quiet = retrain_run(same)
        states = {k: v["state"] for k, v in quiet.items() if k != "_path"}
        assert states["retrain"] == "success" and states["detect_drift"] == "success", states
        assert {quiet[t]["state"] for t in ("train_model", "evaluate_model", "register_model")} == {"skipped"}
        log = api.call("GET", f"{quiet['_path']}/taskInstances/retrain/logs/1?full_content=true")
        assert "trainpipe: not retraining: no drift: 0 of 65 columns drifted" in json.dumps(log), log
        # the training run's and the ingest run's events, posted while the retrain DAG was paused, started no run
        # but were not dropped: they are in this run's batch, each named as skipped, with why, beside the snapshot
        # compared (README). Why depends on which of the two snapshots committed the data first.
        log = json.dumps(api.call("GET", f"{quiet['_path']}/taskInstances/new_snapshot/logs/1?full_content=true"))
        compared = re.search(r"retraining on the new snapshot (\S+) \(the newest new data of (\d+) asset events\)", log)
        assert compared and compared[1] == same, log[-3000:]
        skipped = set(re.findall(r"trainpipe: skipped event (\d+) of (\d+) \(made at [^)]+\): ([^\"\\]+)", log))
        assert {n for _, n, _ in skipped} == {compared[2]}, skipped  # each line counts the whole batch
        # every event but the one compared has one line, with its reason
        assert len({i for i, _, _ in skipped}) == len(skipped) == int(compared[2]) - 1, skipped
        reasons = [why for _, _, why in skipped]
        own = (
            f"run {run['dag_run_id']} of {DAG_ID} trains this snapshot itself"
            if committed["training"]
            else f"the snapshot {same} holds no new data (its content hash is unchanged)"
        )
        theirs = (
            f"the snapshot {ingested_dir} is an older version of the dataset than {same}, which is compared instead"
            if committed["ingest"]
            else f"the snapshot {ingested_dir} holds no new data (its content hash is unchanged)"
        )
        assert own in reasons and theirs in reasons, (committed, reasons)
        drifted = retrain_run(moved)
        states = {k: v["state"] for k, v in drifted.items() if k != "_path"}
        assert states["retrain"] == "success" and states["train_model"] == "success", states
        assert drifted["evaluate_model"]["state"] == "success"
        xcom = api.call("GET", f"{drifted['_path']}/taskInstances/detect_drift/xcomEntries/return_value")
        decision = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
        assert decision["retrain"] and decision["drifted_columns"] == ["pixel_2_3", "pixel_3_4"], decision["reasons"]
    finally:
        stop(procs)
        if mlflow_gen is not None:
            mlflow_gen.close()
    for proc in procs.values():  # nothing of the deployment (task runners included) is left behind
        left = subprocess.run(
            ["pgrep", "-g", str(proc.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        assert left == [], f"processes of airflow {proc.args[3]} still running: {left}"
