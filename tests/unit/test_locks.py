"""trainpipe.contract.locks: one holder at a time, a bounded wait, and a waiter that gives up names the holder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from trainpipe.contract.errors import EXIT_TRANSIENT, InputError, ServiceUnavailable
from trainpipe.contract.locks import exclusive, holder

pytestmark = pytest.mark.unit


def test_a_waiter_that_gives_up_names_the_holder(tmp_path):
    lock = tmp_path / "x.lock"
    with exclusive(lock, what="repo_dir: the thing", wait_s=5):
        assert holder(lock).startswith(f"pid {os.getpid()} on {socket.gethostname()} since 20")
        with pytest.raises(ServiceUnavailable) as caught, exclusive(lock, what="repo_dir: the thing", wait_s=0.1):
            pass  # pragma: no cover (never entered)
    line = str(caught.value)
    assert caught.value.exit_code == EXIT_TRANSIENT and "\n" not in line
    assert line.startswith(f"repo_dir: the thing is locked by pid {os.getpid()} on {socket.gethostname()} since ")
    assert "waited 0.1 s" in line and "a retry waits again" in line
    with exclusive(lock, what="repo_dir: the thing", wait_s=0):  # released: taken at once
        pass
    assert holder(lock) == "a process that has not written its name yet"  # nobody holds it now


def test_a_waiter_says_once_on_whom_it_waits(tmp_path, capsys):
    """A deployment's snapshot waited 39 s on another's lock and its log said nothing until it ended."""
    lock = tmp_path / "x.lock"
    with exclusive(lock, what="repo_dir: the thing", wait_s=5):
        with pytest.raises(ServiceUnavailable), exclusive(lock, what="repo_dir: the thing", wait_s=0.3):
            pass  # pragma: no cover (never entered)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"trainpipe: waiting for repo_dir: the thing, locked by pid {os.getpid()} on {socket.gethostname()} since "
        + lines[0].split(" since ", 1)[1]
    ]
    assert lines[0].endswith("(at most 0.3 s)")
    with exclusive(lock, what="repo_dir: the thing", wait_s=0):  # free: taken at once, nothing said
        pass
    assert capsys.readouterr().err == ""


def test_a_killed_holder_leaves_no_lock(tmp_path):
    """The kernel frees an flock with its process: a SIGKILLed snapshot blocks nobody."""
    lock, ready = tmp_path / "x.lock", tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from trainpipe.contract.locks import exclusive
        with exclusive(Path({str(lock)!r}), what="x", wait_s=0):
            Path({str(ready)!r}).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -9 and ready.exists()
    with exclusive(lock, what="x", wait_s=0):
        pass


def test_a_lock_that_cannot_be_made_is_one_line_naming_the_field(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(InputError) as caught, exclusive(tmp_path / "file" / "x.lock", what="repo_dir: it", wait_s=0):
        pass  # pragma: no cover (never entered)
    line = str(caught.value)
    assert (
        line.startswith(f"repo_dir: it cannot be locked: {str(tmp_path / 'file' / 'x.lock')!r}: ") and "\n" not in line
    )
    assert caught.value.exit_code == 2
