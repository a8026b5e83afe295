"""SIGKILL at any moment of ``trainpipe run``, ``trainpipe train_model`` and ``trainpipe tune_model``, start-up
included: within 2 s no process of the command's tree is left, and no MLflow run is opened afterwards.

Each moment is an event seen from outside (a process of the phase exists), never a sleep. The tree is
every process that inherited this test's tag in its environment, found in ``/proc``: a process started
after the kill (a rank spawned as the command died) is found too, where a snapshot of the tree would miss
it. The MLflow store is a SQLite file read with ``sqlite3`` (no MLflow import in the test).

It used to be that ``trainpipe run`` killed as the ranks spawned left train_model and its ranks alive 9-16 s
(its supervisor asked the tree to stop with a checkpoint instead of killing it), and they opened an MLflow
run after the command was dead; a killed tune worker's training did the same (it got SIGTERM)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

TAG_ENV = "TRAINPIPE_TEST_KILL_TAG"
#: The command a person types, from this environment.
TRAINPIPE = str(Path(sys.executable).parent / "trainpipe")
#: What the issue asks: nothing of the command's tree is left this long after the kill.
WITHIN_S = 2.0
#: A run started this long after the kill was opened by a process that outlived the command (the kill
#: itself reaches every process of the tree within milliseconds; this margin is for a loaded machine).
MARGIN_S = 1.0
TRAIN = {"epochs": 1, "nproc_per_node": 1, "batch_size": 64}


def _tagged(tag: str) -> dict[int, str]:
    """The live processes (pid: command line) whose environment carries ``tag``; zombies have none."""
    found = {}
    needle = f"{TAG_ENV}={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace")
    return found


def _runs(store: Path) -> list[tuple[str, int]]:
    """Every MLflow run in the SQLite store: (name, start time in ms)."""
    if not store.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)) as db:
            return [(str(n), int(t or 0)) for n, t in db.execute("SELECT name, start_time FROM runs")]
    except sqlite3.OperationalError:  # the schema is not there yet: no run either
        return []


def _start(cmd: list[str], tag: str, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, TAG_ENV: tag})


def _phase(tag: str, marker: str) -> Callable[[], bool]:
    """The phase is reached: a process of the tree runs ``marker`` (a module, a program)."""
    return lambda: any(marker in cmd for cmd in _tagged(tag).values())


def _kill_when(proc: subprocess.Popen, ready: Callable[[], bool], tag: str, store: Path, log: Path) -> None:
    """SIGKILL ``proc`` once ``ready()``; then nothing of its tree may be left after :data:`WITHIN_S`, and no
    MLflow run may start after the kill."""
    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None, f"ended before the phase was reached:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"the phase was not reached:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)
    killed_ms = time.time() * 1000
    proc.kill()
    proc.wait()
    gone_by = time.monotonic() + WITHIN_S
    while (left := _tagged(tag)) and time.monotonic() < gone_by:
        time.sleep(0.05)
    for pid in left:  # not left to the rest of the suite
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} processes outlived the command by {WITHIN_S} s: {sorted(left.values())}"
    late = [(name, t) for name, t in _runs(store) if t > killed_ms + MARGIN_S * 1000]
    assert not late, f"MLflow runs opened after the command was killed: {late}"


@pytest.mark.parametrize(
    "marker",
    [
        pytest.param("trainpipe.app.runner", id="engine-starting"),
        pytest.param("trainpipe.training.worker", id="ranks-spawned"),
    ],
)
def test_trainpipe_run_killed_leaves_nothing_behind(tmp_path, tiny_csv, marker):
    tag, store, log = uuid.uuid4().hex, tmp_path / "mlflow.db", tmp_path / "terminal.log"
    config = tmp_path / "pipeline.yaml"
    settings = {"data": str(tiny_csv), "label_column": "target", "workspace": str(tmp_path / "ws")}
    config.write_text(yaml.safe_dump({**settings, "tracking_uri": f"sqlite:///{store}", "train": TRAIN}))
    proc = _start([TRAINPIPE, "run", "--config", str(config)], tag, log)
    _kill_when(proc, _phase(tag, marker), tag, store, log)


@pytest.mark.parametrize(
    "marker",
    [
        pytest.param("trainpipe.components.train_model", id="entrypoint-starting"),
        pytest.param("trainpipe.training.worker", id="ranks-spawned"),
    ],
)
def test_trainpipe_train_model_killed_leaves_nothing_behind(tmp_path, tiny_csv, marker):
    tag, store, log = uuid.uuid4().hex, tmp_path / "mlflow.db", tmp_path / "terminal.log"
    cmd = [TRAINPIPE, "train_model", "--data", str(tiny_csv), "--label-column", "target"]
    cmd += ["--output-dir", str(tmp_path / "m"), "--tracking-uri", f"sqlite:///{store}"]
    cmd += ["--epochs", "1", "--nproc-per-node", "1"]
    proc = _start(cmd, tag, log)
    _kill_when(proc, _phase(tag, marker), tag, store, log)


@pytest.mark.parametrize(
    "marker",
    [
        pytest.param("trainpipe.components.train_model", id="trial-starting"),
        pytest.param("trainpipe.training.worker", id="trial-ranks-spawned"),
    ],
)
def test_trainpipe_tune_model_killed_leaves_nothing_behind(tmp_path, tiny_csv, marker):
    tag, store, log = uuid.uuid4().hex, tmp_path / "mlflow.db", tmp_path / "terminal.log"
    space = {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.1, "log": True}}
    cmd = [TRAINPIPE, "tune_model", "--data", str(tiny_csv), "--label-column", "target"]
    cmd += ["--output-dir", str(tmp_path / "t"), "--tracking-uri", f"sqlite:///{store}", "--n-trials", "1"]
    cmd += ["--space", json.dumps(space), "--train", json.dumps(TRAIN), "--pruner", "none"]
    proc = _start(cmd, tag, log)
    _kill_when(proc, _phase(tag, marker), tag, store, log)
