"""KFP retries a failed task whatever its exit code (its retry policy has no notion of one). What
trainpipe does about it, tested as KFP runs it: the component body's runtime records a permanent
failure (bad input, a failed suite) in the task's output, and a retried attempt of the same task
exits at once with the same code and line without running the step again; a transient failure
(75) records nothing, so the retry runs the step. Each attempt's executions are counted in the
audit log, which every entrypoint run appends to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _free_port
from trainpipe.faces.kfp_runtime import FAILED_RECORD

pytestmark = pytest.mark.integration

ATTEMPT = (
    "import json, sys\nfrom trainpipe.faces.kfp_runtime import run_entrypoint\n"
    "run_entrypoint(sys.argv[1], json.loads(sys.argv[2]), run_id='run-1', output=sys.argv[3])\n"
)


def _attempt(component: str, settings: dict, output: Path, audit: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINPIPE_AUDIT_LOG": str(audit)}
    return subprocess.run(
        [sys.executable, "-c", ATTEMPT, component, json.dumps(settings), str(output)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def _executions(audit: Path, component: str) -> int:
    return sum(
        1
        for line in audit.read_text().splitlines()
        if json.loads(line).get("component") == component and json.loads(line).get("action") == "execute"
    )


def test_a_retried_attempt_of_a_permanent_failure_exits_at_once_with_the_same_code(tmp_path, tiny_csv):
    import pandas as pd

    bad = tmp_path / "bad.csv"
    df = pd.read_csv(tiny_csv)
    df.loc[3, "target"] = None
    df.to_csv(bad, index=False)
    out, audit = tmp_path / "validated", tmp_path / "audit.jsonl"
    settings = {"data": str(bad), "output_dir": str(out), "label_column": "target"}
    first = _attempt("validate_data", settings, out, audit)
    assert first.returncode == 3, first.stderr[-2000:]
    assert json.loads((out / FAILED_RECORD).read_text())["exit_code"] == 3
    retry = _attempt("validate_data", settings, out, audit)
    assert retry.returncode == 3
    last = retry.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "trainpipe validate_data: an earlier attempt of this task failed for good (exit 3), not run again: suite "
        "'trainpipe_default' failed"
    )
    assert _executions(audit, "validate_data") == 1, "the retried attempt ran the step again"


def test_a_transient_failure_records_nothing_and_the_retry_runs_the_step(tmp_path, tiny_csv):
    out, audit = tmp_path / "model", tmp_path / "audit.jsonl"
    settings = {
        "data": str(tiny_csv),
        "output_dir": str(out),
        "label_column": "target",
        "tracking_uri": f"http://127.0.0.1:{_free_port()}",
        "nproc_per_node": 1,
        "epochs": 1,
    }
    for attempt in (1, 2):
        proc = _attempt("train_model", settings, out, audit)
        assert proc.returncode == 75, proc.stderr[-2000:]
        assert not (out / FAILED_RECORD).exists()
        assert _executions(audit, "train_model") == attempt
