"""Security on the real services: MLflow's basic-auth app with per-team permissions, and planted
secrets that must appear in no output of a whole pipeline run.

The tracking server runs MLflow's own ``basic-auth`` app; credentials reach the components only
through MLflow's environment variables. A user without the right on another team's registered
model cannot register into it (exit 77, one line, nothing registered); missing or wrong
credentials are refused the same way, never retried as if the server were down.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import _start_mlflow, make_snapshot, result_of, run_component
from trainpipe.contract.artifacts import MARKER

pytestmark = pytest.mark.integration

ADMIN_PASSWORD = "planted-admin-" + secrets.token_hex(12)
USERS = {"alice": "planted-alice-" + secrets.token_hex(12), "bob": "planted-bob-" + secrets.token_hex(12)}


@pytest.fixture(scope="module")
def auth_mlflow(tmp_path_factory):
    """A tracking server with MLflow's basic-auth app: admin, and users alice (team A) and bob (team B)."""
    root = tmp_path_factory.mktemp("mlflow-auth")
    ini = root / "basic_auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{root / 'auth.db'}\n"
        "admin_username = admin\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
    }
    gen = _start_mlflow(root, f"sqlite:///{root / 'mlflow.db'}", args=("--app-name", "basic-auth"), env=env)
    uri = next(gen)
    for user, password in USERS.items():
        r = requests.post(
            f"{uri}/api/2.0/mlflow/users/create",
            json={"username": user, "password": password},
            auth=("admin", ADMIN_PASSWORD),
            timeout=30,
        )
        assert r.status_code == 200, r.text
    yield uri, root
    gen.close()


def creds(user: str, password: str | None = None) -> dict[str, str]:
    return {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password or USERS[user]}


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, tiny_csv):
    return make_snapshot(tmp_path_factory.mktemp("auth-chain"), tiny_csv)


def _train_and_gate(tmp_path: Path, snapshot: Path, uri: str, user: str) -> tuple[Path, Path]:
    model, decision = tmp_path / f"m-{user}", tmp_path / f"e-{user}"
    result_of(
        run_component(
            "train_model",
            "--data",
            str(snapshot),
            "--output-dir",
            str(model),
            "--label-column",
            "target",
            "--tracking-uri",
            uri,
            "--experiment-name",
            f"team-{user}",
            "--seed",
            str(len(user)),
            "--nproc-per-node",
            "1",
            "--epochs",
            "2",
            "--batch-size",
            "32",
            env=creds(user),
        )
    )
    result_of(
        run_component(
            "evaluate_model",
            "--model",
            str(model),
            "--data",
            str(snapshot),
            "--output-dir",
            str(decision),
            "--label-column",
            "target",
            "--thresholds",
            '{"accuracy": 0.5}',
            env=creds(user),
        )
    )
    return model, decision


def _register(
    tmp_path: Path, model: Path, decision: Path, uri: str, out: str, env: dict
) -> subprocess.CompletedProcess:
    return run_component(
        "register_model",
        "--model",
        str(model),
        "--decision",
        str(decision),
        "--output-dir",
        str(tmp_path / out),
        "--tracking-uri",
        uri,
        "--model-name",
        "team-a-model",
        env=env,
    )


def test_a_user_without_the_right_cannot_register_into_another_teams_model(tmp_path, snapshot, auth_mlflow):
    """Slow on purpose (about 1.5 minutes): two teams each train, gate and register a real model against a tracking
    server with basic auth, since the permission is checked on real registrations, not on a stand-in."""
    import mlflow

    uri, _ = auth_mlflow
    a_model, a_decision = _train_and_gate(tmp_path, snapshot, uri, "alice")
    first = result_of(_register(tmp_path, a_model, a_decision, uri, "r-alice", creds("alice")))
    assert first["created"] and first["version"] == "1"

    b_model, b_decision = _train_and_gate(tmp_path, snapshot, uri, "bob")
    cases = {
        "bob": (creds("bob"), "permission denied (HTTP 403"),
        "wrong-password": (creds("bob", "not-the-password"), "credentials not accepted (HTTP 401"),
        "anonymous": (
            {"MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""},
            "credentials not accepted (HTTP 401",
        ),
    }
    for name, (env, needle) in cases.items():
        proc = _register(tmp_path, b_model, b_decision, uri, f"r-{name}", env)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 77, (name, proc.stderr[-2000:])
        assert (
            needle in last
            and last.startswith("trainpipe register_model: error: tracking_uri:")
            and "Traceback" not in proc.stderr
        )
        assert not (tmp_path / f"r-{name}" / MARKER).exists()
        assert USERS["bob"] not in proc.stderr
    admin = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD}
    os.environ.update(admin)
    try:
        versions = mlflow.MlflowClient(uri).search_model_versions("name = 'team-a-model'")
    finally:
        for k in admin:
            os.environ.pop(k)
    assert [v.version for v in versions] == ["1"]

    # granted EDIT on team A's model, bob can register into it
    r = requests.post(
        f"{uri}/api/3.0/mlflow/users/permissions/grant",
        auth=("admin", ADMIN_PASSWORD),
        timeout=30,
        json={
            "username": "bob",
            "resource_type": "registered_model",
            "resource_id": "team-a-model",
            "permission": "EDIT",
        },
    )
    assert r.status_code == 200, r.text
    granted = result_of(_register(tmp_path, b_model, b_decision, uri, "r-granted", creds("bob")))
    assert granted["created"] and granted["version"] == "2"


def _occurrences(roots: list[Path], blobs: dict[str, bytes], needles: dict[str, str]) -> list[str]:
    """Every (secret, place) where a secret's bytes appear: files under ``roots`` (databases and logs
    included, read as bytes) and the captured outputs in ``blobs``."""
    found = []
    encoded = {name: value.encode() for name, value in needles.items()}
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                found += [f"{name} in {path}" for name, value in encoded.items() if value in data]
    for where, data in blobs.items():
        found += [f"{name} in {where}" for name, value in encoded.items() if value in data]
    return found


def test_planted_secrets_appear_in_no_output_of_a_pipeline_run(tmp_path, tiny_csv, auth_mlflow):
    """Slow on purpose (about 1.2 minutes): the pipeline must really run with the secrets to show none leaks.

    The secrets are in the environment and an Airflow connection; the pipeline runs for real with
    them (the MLflow password is used on every call); then every output is searched byte for byte."""
    uri, mlflow_root = auth_mlflow
    planted = {
        "MLFLOW_TRACKING_PASSWORD": USERS["alice"],
        "AWS_SECRET_ACCESS_KEY": "planted-aws-" + secrets.token_hex(12),
        "KFP_EXISTING_TOKEN": "planted-kfp-" + secrets.token_hex(12),
        "connection password": "planted-conn-" + secrets.token_hex(12),
        "TRAINPIPE_TEST_API_KEY": "planted-key-" + secrets.token_hex(12),
    }
    env = {
        **os.environ,
        "MLFLOW_TRACKING_USERNAME": "alice",
        "MLFLOW_TRACKING_PASSWORD": planted["MLFLOW_TRACKING_PASSWORD"],
        "AWS_ACCESS_KEY_ID": "trainpipe-test",
        "AWS_SECRET_ACCESS_KEY": planted["AWS_SECRET_ACCESS_KEY"],
        "KFP_EXISTING_TOKEN": planted["KFP_EXISTING_TOKEN"],
        "TRAINPIPE_TEST_API_KEY": planted["TRAINPIPE_TEST_API_KEY"],
        "AIRFLOW_CONN_TEAM_WAREHOUSE": (
            f"postgresql://svc:{planted['connection password']}@warehouse.example.com:5432/dw"
        ),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    ws = tmp_path / "ws"
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": str(tiny_csv),
                "label_column": "target",
                "workspace": str(ws),
                "tracking_uri": uri,
                "model_name": "secrets-check",
                "experiment_name": "secrets-check",
                "thresholds": {"accuracy": 0.5},
                "train": {"nproc_per_node": 1, "epochs": 2, "batch_size": 32},
            }
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "run", "--config", str(config), "--engine", "airflow-local"],
        capture_output=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:].decode(errors="replace")
    # the run really used the credentials: a version is registered on the auth server
    assert b"secrets-check" in run.stdout and (ws / "audit" / "audit.jsonl").is_file()
    # the audit trail of the run: an execution per step, the drift check, the gate and the aliases, chained and intact
    from trainpipe.contract import audit

    log = ws / "audit" / "audit.jsonl"
    assert audit.verify(log)["records"] >= 8
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(r["component"] for r in records if r["action"] == "execute") == sorted(
        [
            "validate_data",
            "snapshot_dataset",
            "detect_drift",
            "train_model",
            "profile_training",
            "evaluate_model",
            "register_model",
        ]
    )
    assert [r["decision"]["retrain"] for r in records if r["action"] == "drift_check"] == [True]
    assert all(
        r["status"] == "ok" and r["run"]["orchestrator"] == "airflow" for r in records if r["action"] == "execute"
    )
    assert [r["decision"]["passed"] for r in records if r["action"] == "gate"] == [True]
    assert sorted(r["decision"]["alias"] for r in records if r["action"] == "alias") == ["challenger", "champion"]
    sources = {"TRAINPIPE_IDENTITY", "kubernetes service account", "airflow dag owner", "os user"}
    assert all(r["who"]["identity"] and r["who"]["source"] in sources for r in records), {
        json.dumps(r["who"]) for r in records
    }
    snap = next(r for r in records if r["component"] == "snapshot_dataset")
    assert snap["inputs"]["data"]["marker_sha256"] and snap["outputs"]["output_dir"]["marker_sha256"]
    compiled = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "compile", "-o", str(tmp_path / "pipeline.yaml")],
        capture_output=True,
        env=env,
        check=True,
    )
    from airflow.sdk import DAG  # noqa: F401  (the rendered DAG params are in the Airflow DB under ws)

    roots = [ws, mlflow_root, tmp_path / "pipeline.yaml", Path(__file__).resolve().parents[2] / "dags"]
    blobs = {
        "trainpipe run stdout": run.stdout,
        "trainpipe run stderr": run.stderr,
        "compile output": compiled.stdout + compiled.stderr,
    }
    # the search finds what is there: the password is in the auth server's config only as a hash, but a
    # planted control file must be found
    control = tmp_path / "control" / "leak.txt"
    control.parent.mkdir()
    control.write_text(planted["AWS_SECRET_ACCESS_KEY"])
    assert _occurrences([control.parent], {}, planted) == [f"AWS_SECRET_ACCESS_KEY in {control}"]
    files = sum(1 for r in roots for p in ([r] if r.is_file() else r.rglob("*")) if p.is_file())
    assert files > 50, files
    assert _occurrences(roots, blobs, planted) == []
    # the MLflow tracking store: no param or tag holds a secret either (read through the API as well as the bytes)
    import mlflow

    os.environ.update({"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": USERS["alice"]})
    try:
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name("secrets-check")
        values = [json.dumps({**r.data.params, **r.data.tags}) for r in client.search_runs([exp.experiment_id])]
        values += [json.dumps(v.tags) for v in client.search_model_versions("name = 'secrets-check'")]
    finally:
        for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            os.environ.pop(k)
    assert len(values) >= 2 and not any(s in v for v in values for s in planted.values())
