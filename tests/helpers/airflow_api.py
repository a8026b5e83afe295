"""A real Airflow deployment's public REST API (v2), and waiting on it, for the scheduler tests."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest


class Api:
    """Airflow's public REST API (v2) with a JWT from the simple auth manager's /auth/token."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.token = ""

    def call(self, method: str, path: str, body: dict | None = None, ok: bool = True) -> dict:
        """The response's JSON; with ``ok=False`` an HTTP error is returned (``status`` and its body) too."""
        req = urllib.request.Request(
            self.base + path, method=method, data=json.dumps(body).encode() if body is not None else None
        )
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if ok:
                raise
            return {"status": exc.code, "body": exc.read().decode("utf-8", "replace")}

    def login(self, user: str, password: str) -> None:
        self.token = self.call("POST", "/auth/token", {"username": user, "password": password})["access_token"]


def _wait(what: str, check, timeout: float, procs: dict, logs: Path, every: float = 2.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                pytest.fail(
                    f"airflow {name} exited {proc.returncode} while waiting for "
                    f"{what}:\n{(logs / f'{name}.log').read_text()[-3000:]}"
                )
        value = check()
        if value:
            return value
        time.sleep(every)
    tails = "\n".join(f"--- {n}\n{(logs / f'{n}.log').read_text()[-1500:]}" for n in procs)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")


def start(airflow: list[str], name: str, args: list[str], env: dict, logs: Path, procs: dict) -> None:
    """One Airflow process of the deployment, in its own process group, its output in ``logs/<name>.log``."""
    import subprocess

    procs[name] = subprocess.Popen(
        [*airflow, *args],
        env=env,
        stdout=open(logs / f"{name}.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def serving(api: Api, procs: dict, logs: Path, user: str, password: str, dag_id: str) -> dict:
    """Wait until the api-server and the scheduler report healthy, log in, wait until the
    dag-processor has parsed ``dag_id`` without import errors, and unpause it. Returns the DAG as
    the API first showed it."""
    import urllib.error

    def healthy():
        try:
            health = api.call("GET", "/api/v2/monitor/health")
        except (OSError, ValueError):
            return False
        return (
            health.get("metadatabase", {}).get("status") == "healthy"
            and health.get("scheduler", {}).get("status") == "healthy"
        )

    _wait("the api-server and scheduler to report healthy", healthy, 180, procs, logs)
    api.login(user, password)

    def parsed():
        try:
            return api.call("GET", f"/api/v2/dags/{dag_id}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    dag = _wait(f"the dag-processor to parse {dag_id}", parsed, 180, procs, logs)
    errors = api.call("GET", "/api/v2/importErrors")
    assert errors["total_entries"] == 0, errors
    api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    return dag


def stop(procs: dict) -> None:
    """SIGTERM every process group of the deployment; SIGKILL what has not ended in 30 s."""
    import os
    import signal
    import subprocess

    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
