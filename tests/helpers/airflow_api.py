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

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(self.base + path, method=method, data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def login(self, user: str, password: str) -> None:
        self.token = self.call("POST", "/auth/token", {"username": user, "password": password})["access_token"]


def _wait(what: str, check, timeout: float, procs: dict, logs: Path, every: float = 2.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                pytest.fail(f"airflow {name} exited {proc.returncode} while waiting for {what}:\n{(logs / f'{name}.log').read_text()[-3000:]}")
        value = check()
        if value:
            return value
        time.sleep(every)
    tails = "\n".join(f"--- {n}\n{(logs / f'{n}.log').read_text()[-1500:]}" for n in procs)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
