"""The ``trainpipe`` command as a user runs it: from a folder of theirs, with none of the suite's settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TRAINPIPE = str(Path(sys.executable).parent / "trainpipe")
#: What a user's shell would not carry: the suite's path to its fixtures, a config of another test.
FOREIGN = ("PYTHONPATH", "TRAINPIPE_CONFIG")


def trainpipe_in(folder: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``trainpipe ARGS`` run from ``folder`` (a team's package there is importable only because it is there)."""
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN}
    return subprocess.run(
        [TRAINPIPE, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
