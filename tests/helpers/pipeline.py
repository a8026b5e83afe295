"""Run the reference pipeline as a person does: ``trainpipe run --config ... --engine ...``, with Airflow's
home under the test's folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_pipeline(
    config: Path, engine: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {
        **(os.environ if env is None else env),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    return subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "run", "--config", str(config), "--engine", engine],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
