"""``[core] hostname_callable`` for the Celery test: each worker reports the name in its environment
(TRAINPIPE_TEST_WORKER), so a task instance's hostname says which of the workers on this one
machine ran it."""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    return os.environ.get("TRAINPIPE_TEST_WORKER") or socket.getfqdn()
