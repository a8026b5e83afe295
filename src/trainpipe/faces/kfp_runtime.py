"""What a KFP component body calls inside its container: the same entrypoint a
person would run by hand, as a subprocess. Stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any


def run_entrypoint(name: str, settings: dict[str, Any], run_id: str = "") -> dict[str, Any]:
    """Run ``python -m trainpipe.components.<name>`` with ``settings`` as flags.

    Exits the process with the entrypoint's own exit code when it fails, so the
    task fails with the documented code.

    Returns:
        The component's result JSON.
    """
    from trainpipe.faces.command import component_command

    cmd = component_command(name, settings, orchestrator="kfp", run_id=run_id)
    env = dict(os.environ, TRAINPIPE_ORCHESTRATOR="kfp")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=False)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_dataset_hash(snapshot: Any, dataset_md5: str) -> None:
    """The ``dataset_md5`` parameter (part of the task's cache key) must name the snapshot it came with.

    The pipeline passes snapshot_dataset's md5 output as a plain parameter, so KFP's cache
    key of every data-consuming task includes the DVC content hash: new data never hits a
    stale cache. A mismatch means the wiring is wrong: exit 2 (bad input), no retry.
    """
    recorded = (getattr(snapshot, "metadata", None) or {}).get("md5")
    if dataset_md5 and recorded and recorded != dataset_md5:
        print(f"trainpipe: error: dataset_md5: {dataset_md5} is not the snapshot's md5 {recorded}", file=sys.stderr)
        sys.exit(2)


def copy_file(src: str, dest: str) -> None:
    """Copy one file to an output artifact path (for Output[HTML] and the like)."""
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    shutil.copyfile(src, dest)


def log_metrics(metrics_artifact: Any, values: dict[str, Any]) -> None:
    """Log every numeric value onto a KFP ``Output[Metrics]``."""
    for key, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:  # NaN is not JSON
            metrics_artifact.log_metric(key, float(value))
