"""An exclusive lock on a file, waited for within a bound, that names its holder.

Steps that write one shared thing (a DVC repository) take it around the whole write. It is an
``flock`` on an open file: the kernel releases it when its holder's process ends, however it ends
(SIGKILL, an OOM kill), so no lock is ever left behind by a dead holder and none is ever broken by a
waiter. The file itself stays (removing it would let a waiter lock a file nobody else opens); while
the lock is held it says who holds it (pid, host, since), which a waiter that gives up names in its
one line. Local disks and NFS shares (where Linux maps ``flock`` onto NFS byte-range locks) both hold
it across processes and hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from trainpipe.contract.errors import InputError, ServiceUnavailable


def holder(path: Path) -> str:
    """Who holds the lock at ``path``, as its file says: ``pid 123 on host-a since 2026-11-28T05:40:01Z``."""
    try:
        doc = json.loads(Path(path).read_text() or "{}")
        return f"pid {int(doc['pid'])} on {doc['host']} since {doc['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


@contextlib.contextmanager
def exclusive(path: Path, *, what: str, wait_s: float, poll_s: float = 0.02) -> Iterator[None]:
    """Hold the lock at ``path`` (created if missing) for the block, waiting at most ``wait_s`` for it.

    Args:
        path: The lock file.
        what: The start of the line a waiter that gives up says, naming the field and the thing locked
            (``"repo_dir: the DVC repository '/ws/repo'"``).
        wait_s: How long to wait for another holder to finish.
        poll_s: The first pause between tries (doubled up to 0.25 s, with jitter).

    Raises:
        ServiceUnavailable: another process held it for all of ``wait_s`` (transient: a retry waits again);
            the line names the holder.
        InputError: the lock file cannot be created there (a read-only folder, a file in the way).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the tools the holder starts
    except OSError as exc:
        raise InputError(f"{what} cannot be locked: {str(path)!r}: {exc.strerror or exc}") from None
    try:
        deadline, delay, said = time.monotonic() + wait_s, poll_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:  # one line while it waits, so a step that seems to hang says on whom
                    print(
                        f"trainpipe: waiting for {what}, locked by {holder(path)} (at most {wait_s:g} s)",
                        file=sys.stderr,
                        flush=True,
                    )
                    said = True
                if time.monotonic() >= deadline:
                    raise ServiceUnavailable(
                        f"{what} is locked by {holder(path)} (waited {wait_s:g} s for {str(path)!r}); "
                        "it is freed when that process ends: a retry waits again"
                    ) from None
                time.sleep(min(delay * (0.5 + random.random()), max(0.0, deadline - time.monotonic())))  # noqa: S311
                delay = min(delay * 2, 0.25)
        since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released: nobody holds it (the kernel frees the lock itself on close)
    finally:
        os.close(fd)


__all__ = ["exclusive", "holder"]
