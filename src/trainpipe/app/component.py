"""``trainpipe <component>``: the component's entrypoint itself, in the process the command started."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def run_component(name: str, args: list[str]) -> NoReturn:
    """Become ``python -m trainpipe.components.<name> args...`` (exec: this process, not a child of it).

    What is sent to ``trainpipe <component>`` reaches the entrypoint itself: SIGTERM stops a training at
    its step's end with a checkpoint (exit 75), SIGKILL takes its ranks with it (their lifeline), and no
    process of the step outlives the command that was started."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execv(sys.executable, [sys.executable, "-m", f"trainpipe.components.{name}", *args])
