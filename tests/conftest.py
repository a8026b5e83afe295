"""Shared fixtures: demo data, a real MLflow tracking server process, entrypoint runner."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_component(
    name: str,
    *args: str,
    env: dict | None = None,
    timeout: int = 600,
    cwd: Path | None = None,
    process: bool = False,
) -> subprocess.CompletedProcess:
    """Run a component's entrypoint: in this process (the same ``entrypoint.run`` with the component's model
    and core, its output captured: :mod:`tests.helpers.entry`), or with ``process`` as a container would, in a
    new interpreter (the exit status, what the process leaves behind, signals)."""
    if not process:
        from tests.helpers.entry import call_component

        return call_component(name, *args, env=env, cwd=cwd)
    return subprocess.run(
        [sys.executable, "-m", f"trainpipe.components.{name}", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def seeded(default: int) -> int:
    """A random test's seed, printed so a failure can be replayed: ``TRAINPIPE_TEST_SEED`` sets it."""
    seed = int(os.environ.get("TRAINPIPE_TEST_SEED", default))
    print(f"random seed {seed} (replay with TRAINPIPE_TEST_SEED={seed})")
    return seed


def result_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_snapshot(root: Path, csv: Path, label_column: str = "target", dataset_name: str | None = None) -> Path:
    """validate_data then snapshot_dataset (local DVC remote) under ``root``; returns the snapshot artifact.

    ``root/v`` holds the validated data, ``root/repo`` the DVC repository, ``root/remote`` its remote."""
    result_of(
        run_component(
            "validate_data", "--data", str(csv), "--output-dir", str(root / "v"), "--label-column", label_column
        )
    )
    result_of(
        run_component(
            "snapshot_dataset",
            "--data",
            str(root / "v"),
            "--output-dir",
            str(root / "s"),
            "--repo-dir",
            str(root / "repo"),
            "--remote-url",
            str(root / "remote"),
            *(["--dataset-name", dataset_name] if dataset_name else []),
        )
    )
    return root / "s"


@pytest.fixture(scope="session")
def digits_csv(tmp_path_factory) -> Path:
    from trainpipe.demo import write_digits

    return write_digits(tmp_path_factory.mktemp("raw") / "digits.csv")


@pytest.fixture(scope="session")
def tiny_csv(tmp_path_factory) -> Path:
    """A small, generic dataset with a non-default label column name."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 4))
    y = np.where(x[:, 0] + x[:, 1] > 0, "yes", "no")
    df = pd.DataFrame(x, columns=["f1", "f2", "f3", "f4"]).assign(target=y)
    path = tmp_path_factory.mktemp("tiny") / "tiny.csv"
    df.to_csv(path, index=False)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A free loopback port p with p + 1 free too (a 2-rank job serves metrics on both)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two adjacent free ports")


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Wait until ``url`` answers 200; raise with the tail of ``log`` if ``proc`` exits first, and
    kill it if ``timeout`` seconds pass."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited before {url} answered: " + log.read_text()[-3000:])
    proc.kill()
    raise RuntimeError(f"{url} did not answer in {timeout:.0f} s: " + log.read_text()[-3000:])


def _start_mlflow(
    root: Path, backend_store: str, port: int | None = None, args: tuple[str, ...] = (), env: dict | None = None
):
    """A real `mlflow server` process on 127.0.0.1; yields its URI and stops it.

    ``args`` replace the default artifact store (proxied, under ``root``) when they name one.
    """
    port = port or _free_port()
    store = (
        []
        if any(a.startswith("--default-artifact-root") for a in args)
        else ["--artifacts-destination", str(root / "artifacts")]
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            backend_store,
            *store,
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=open(root / "server.log", "w"),
        stderr=subprocess.STDOUT,
        # MLflow 3's job runner (seven huey consumers per server, polling) serves GenAI jobs no test uses:
        # on two cores its polling is a share of every test's time.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})},
    )
    uri = f"http://127.0.0.1:{port}"
    wait_http(f"{uri}/health", proc, root / "server.log", 120)
    try:
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server process on 127.0.0.1 with a SQLite backend."""
    root = tmp_path_factory.mktemp("mlflow")
    yield from _start_mlflow(root, f"sqlite:///{root / 'mlflow.db'}")


PG_URL = os.environ.get("TRAINPIPE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432")


@contextlib.contextmanager
def fresh_postgres_db(prefix: str):
    """A new PostgreSQL database on the local server, dropped afterwards; yields its name.
    Under CI a missing server fails the test instead of skipping it."""
    import uuid

    try:
        import psycopg2
    except ImportError:  # pragma: no cover - the mlflow and airflow extras install it
        pytest.fail("psycopg2 is not installed")
    db = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg2.connect(f"{PG_URL}/postgres", connect_timeout=5)
    except psycopg2.OperationalError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL at {PG_URL} is required under CI: {exc}")
        pytest.skip(f"PostgreSQL at {PG_URL} is not reachable: {exc}")
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {db}")
    try:
        yield db
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.close()


def psycopg2_url(db: str) -> str:
    """SQLAlchemy's default PostgreSQL driver is psycopg 3; the extras ship psycopg2: name it."""
    return f"{PG_URL.replace('postgresql://', 'postgresql+psycopg2://', 1)}/{db}"


@pytest.fixture(scope="session")
def mlflow_server_postgres(tmp_path_factory):
    """A real MLflow tracking server on PostgreSQL (as in production), in a fresh database."""
    with fresh_postgres_db("trainpipe_test") as db:
        yield from _start_mlflow(tmp_path_factory.mktemp("mlflow-pg"), psycopg2_url(db))
