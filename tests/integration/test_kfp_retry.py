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


def _body(component: str, settings: dict, output: Path, **env: str) -> subprocess.Popen:
    """A KFP body as its executor runs it: one process, one thread, calling the runtime; it prints the result."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json\n"
            + ATTEMPT.replace("run_entrypoint(", "print(json.dumps(run_entrypoint(").rstrip("\n")
            + "))\n",
            component,
            json.dumps(settings),
            str(output),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def test_the_step_runs_in_a_fork_of_the_body_and_gives_what_a_new_interpreter_gives(tmp_path, tiny_csv):
    """The body forks its step (no second interpreter importing trainpipe again); with TRAINPIPE_KFP_NO_FORK=1 it
    starts ``python -m`` as before: the same result, the same one line, and stdout holds nothing but the result."""
    from trainpipe.faces.kfp_runtime import NO_FORK_ENV

    results = {}
    for way, env in (("fork", {}), ("subprocess", {NO_FORK_ENV: "1"})):
        out = tmp_path / way
        settings = {"data": str(tiny_csv), "output_dir": str(out), "label_column": "target"}
        body = _body("validate_data", settings, out, **env)
        stdout, stderr = body.communicate(timeout=300)
        assert body.returncode == 0, stderr[-2000:]
        assert len(stdout.splitlines()) == 1, stdout  # the result travels to the body, not to its log
        assert "trainpipe validate_data: ok in" in stderr
        results[way] = json.loads(stdout)
    keep = ("success", "rows", "data_md5", "successful", "evaluated", "suite_name")
    assert {k: results["fork"][k] for k in keep} == {k: results["subprocess"][k] for k in keep}
    assert results["fork"]["success"] is True and results["fork"]["rows"] == 240


def test_a_killed_body_takes_its_forked_step_and_the_steps_ranks_with_it(tmp_path, digits_csv):
    """SIGKILL to the body (KFP's pod deleted past its grace, an OOM): the forked step gets SIGTERM from the kernel,
    stops its ranks and exits before its 50 epochs end (no model written); no process of the step outlives it."""
    import signal
    import time

    from trainpipe.contract.lifeline import descendants

    out = tmp_path / "model"
    settings = {
        "data": str(digits_csv),
        "output_dir": str(out),
        "label_column": "label",
        "nproc_per_node": 2,
        "epochs": 50,
        "train_function": "teampkg.slow:train",
        "train_config": {"sleep_s": 0.05},
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    fixtures = str(Path(__file__).resolve().parents[1] / "fixtures")
    body = _body("train_model", settings, out, PYTHONPATH=fixtures, TRAINPIPE_TRUSTED_MODEL_CODE="teampkg")
    deadline = time.monotonic() + 300
    ranks: list[int] = []
    while len(ranks) < 3 and time.monotonic() < deadline:  # the step and its two ranks are up
        assert body.poll() is None, body.communicate()[1][-2000:]
        ranks = descendants(body.pid)
        time.sleep(0.1)
    assert len(ranks) >= 3, ranks
    body.send_signal(signal.SIGKILL)
    body.wait(timeout=30)
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in ranks):
        time.sleep(0.1)
    left = [pid for pid in ranks if os.path.exists(f"/proc/{pid}")]
    assert not left, f"outlived the body: {left}"
    from trainpipe.contract.layout import MODEL_FILE

    assert not (out / MODEL_FILE).exists(), "the step trained to its end: it never learned that its body died"
