"""The supervisor's two endings: a stop asks its tree to end within a grace period (a training checkpoints),
its parent's death kills the tree at once (``trainpipe run`` killed: nobody waits for a checkpoint)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

#: The driver under the supervisor: starts a process in a session of its own that ignores SIGTERM (a rank
#: still importing its framework cannot act on it either), writes its pid, and waits.
DRIVER = textwrap.dedent(
    """
    import subprocess, sys
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "open(sys.argv[1], 'w').write('ready'); time.sleep(120)", sys.argv[1] + ".ready"],
        start_new_session=True,
    )
    open(sys.argv[1], "w").write(str(stubborn.pid))
    stubborn.wait()
    """
)
#: ``trainpipe run``'s part: start the supervised driver (PARENT_ENV set, as run_engine does) and wait.
COMMAND = textwrap.dedent(
    """
    import os, subprocess, sys
    from trainpipe.contract.lifeline import PARENT_ENV, supervised
    env = dict(os.environ, **{PARENT_ENV: str(os.getpid())})
    sys.exit(subprocess.Popen(supervised([sys.executable, "-c", sys.argv[1], sys.argv[2]]), env=env).wait())
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _started(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    marker = tmp_path / "pid"
    command = subprocess.Popen([sys.executable, "-c", COMMAND, DRIVER, str(marker)])
    deadline = time.monotonic() + 60
    while not (marker.with_suffix(".ready").exists() and marker.exists() and marker.read_text()):
        assert command.poll() is None and time.monotonic() < deadline, "the driver did not start"
        time.sleep(0.02)
    return command, int(marker.read_text())


def test_the_parents_death_kills_the_tree_at_once_even_what_ignores_sigterm(tmp_path):
    command, stubborn = _started(tmp_path)
    command.kill()
    command.wait()
    deadline = time.monotonic() + 2.0
    while _alive(stubborn) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = _alive(stubborn)
    if left:
        os.kill(stubborn, signal.SIGKILL)
    assert not left, "a process of the tree outlived its command by 2 s (it was given a stop's grace instead)"


def test_a_stop_gives_the_tree_its_grace(tmp_path):
    """A SIGTERM to the supervisor (run_engine passes on a Ctrl-C this way) ends the driver at once and gives
    the rest the grace period: a training there checkpoints at its step's end."""
    from trainpipe.contract.lifeline import EXIT_STOPPED, descendants

    command, stubborn = _started(tmp_path)
    supervisor, driver = descendants(command.pid)[:2]
    try:
        os.kill(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(driver) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(driver) and _alive(stubborn), "a stop did not end the driver, or gave the rest no grace"
    finally:
        os.kill(stubborn, signal.SIGKILL)
    assert command.wait(timeout=10) == EXIT_STOPPED
