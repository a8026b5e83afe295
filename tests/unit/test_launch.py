"""The launcher's process handling: what it starts dies with it, and stopping a group always ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from trainpipe.contract import lifeline
from trainpipe.training import launch

pytestmark = pytest.mark.unit


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_group_dies_with_its_launcher_even_one_killed_with_sigkill(tmp_path):
    """The launcher runs with a busy thread beside it (as it does: the relays), starts its group
    without running Python between fork and exec, and a SIGKILL to it still takes the group along."""
    pidfile = tmp_path / "child.pid"
    script = f"""
import threading, time
from pathlib import Path
from trainpipe.training.launch import Plan, run_plan
threading.Thread(target=lambda: [time.sleep(0.001) for _ in iter(int, 1)], daemon=True).start()
cmd = ["sh", "-c", "echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && env > {tmp_path}/env && exec sleep 60"]
run_plan(Plan([cmd], [{{}}], 0, "t"), Path("{tmp_path}/errors"))
"""
    launcher = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists():
            assert launcher.poll() is None and time.monotonic() < deadline, "the launcher did not start its group"
            time.sleep(0.05)
        child = int(pidfile.read_text())
        assert os.getpgid(child) == child  # a session of its own: the group is stopped as one
        assert launch.PARENT_ENV not in (tmp_path / "env").read_text()  # the guard consumed it before exec
        launcher.kill()
        launcher.wait()
        assert _gone(child, 5.0), "the group outlived its launcher"
    finally:
        launcher.kill()


def test_a_process_whose_launcher_died_before_it_ran_leaves_at_once(tmp_path):
    marker = tmp_path / "ran"
    proc = subprocess.run(
        lifeline.guarded(["touch", str(marker)], launch.GUARD_SIGNAL),
        env={**os.environ, launch.PARENT_ENV: "1"},
        timeout=30,
    )
    assert proc.returncode == 1 and not marker.exists()
    ok = subprocess.run(
        lifeline.guarded(["touch", str(marker)], launch.GUARD_SIGNAL),
        env={**os.environ, launch.PARENT_ENV: str(os.getpid())},
        timeout=30,
    )
    assert ok.returncode == 0 and marker.exists()


def test_stopping_a_group_ends_even_a_process_outside_its_own_process_group():
    """SIGTERM ignored and no process group of its own: killpg cannot reach it, the stop still
    ends it (it used to wait for it forever)."""
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline()  # the handler is in place
    stopper = threading.Thread(target=launch._stop, args=([stubborn],), kwargs={"grace": 0.5}, daemon=True)
    stopper.start()
    stopper.join(15)
    assert not stopper.is_alive() and stubborn.returncode == -signal.SIGKILL
