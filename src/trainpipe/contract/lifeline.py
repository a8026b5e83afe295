"""A child process that dies with the process that started it. Stdlib only: the faces use it inside a
container, the launcher for its ranks.

``python -c guard(sig) cmd...`` asks the kernel to send ``sig`` to the child when its parent dies
(``PR_SET_PDEATHSIG``), checks the parent did not die in between, then becomes ``cmd``. A face's
entrypoint gets SIGTERM: it stops its ranks at their step's end, checkpoints and exits 75, so a killed
Airflow task (SIGKILL: a timeout, "mark failed", an OOM) or a killed KFP body leaves no training behind
and a retry resumes. Not ``preexec_fn``: Python between fork and exec can deadlock while the parent has
threads. Where ``prctl`` does not exist (not Linux) the child simply runs.
"""

from __future__ import annotations

import signal
import sys

#: Set for each guarded child: the pid it must still be the child of once it asked to die with it.
PARENT_ENV = "TRAINPIPE_PARENT_PID"


def guard(signum: int = signal.SIGTERM) -> str:
    """The ``python -c`` program that dies with its parent by ``signum``, then execs ``sys.argv[1:]``."""
    return (
        "import os, sys\n"
        "try:\n"
        "    import ctypes\n"
        f"    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, {int(signum)})\n"
        "except (OSError, AttributeError):\n"
        "    pass\n"
        f"if os.getppid() != int(os.environ.pop('{PARENT_ENV}', os.getppid())): os._exit(1)\n"
        "os.execvp(sys.argv[1], sys.argv[1:])\n"
    )


def guarded(cmd: list[str], signum: int = signal.SIGTERM) -> list[str]:
    """``cmd`` started so that it gets ``signum`` when this process dies (set :data:`PARENT_ENV` to this pid)."""
    return [sys.executable, "-c", guard(signum), *cmd]
