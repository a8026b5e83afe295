"""A preemption spends no retry on Airflow, in process: the operator runs a preempted step again in the same try,
up to ``max_preemptions`` times; one more fails as a transient exit does, and a last try never says "will retry"."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from trainpipe.faces.airflow_operator import TrainpipeOperator, rerun_after

pytestmark = pytest.mark.unit

PREEMPTED = "preempted by SIGTERM at step 3: a retry resumes from ckpt-3"

#: A step that is preempted in its first TIMES runs (its record written as train_model writes it), then succeeds.
STEP = """
import json, os, sys
times, record = int(sys.argv[1]), sys.argv[2]
if int(os.environ["TRAINPIPE_PREEMPTION"]) < times:
    json.dump({"component": "fake", "exit_code": 75, "message": sys.argv[3]}, open(record, "w"))
    sys.exit(75)
print(json.dumps({"runs": int(os.environ["TRAINPIPE_PREEMPTION"]) + 1}))
"""


class FakeOperator(TrainpipeOperator):
    component: ClassVar[str] = "fake"

    def __init__(self, *, times: int, message: str = PREEMPTED, **kwargs: Any) -> None:
        super().__init__(settings={}, **kwargs)
        self.times, self.message = times, message

    def command(self, context: Any, error_record: str | None = None) -> list[str]:
        return [sys.executable, "-c", STEP, str(self.times), str(error_record), self.message]


def context(try_number: int = 1, retries: int = 1) -> dict[str, Any]:
    return {"run_id": "manual__1", "ti": SimpleNamespace(try_number=try_number, task=SimpleNamespace(retries=retries))}


def test_the_decision_reruns_a_preemption_under_the_bound_only():
    line = rerun_after("train_model", 75, PREEMPTED, 0, 3)
    assert line == f"train_model: {PREEMPTED} (preemption 1 of at most 3: running it again, no retry spent)"
    assert rerun_after("train_model", 75, PREEMPTED, 3, 3) is None  # over the bound: a failure like any other
    assert rerun_after("detect_drift", 75, "tracking server unreachable: http://mlflow:5000", 0, 3) is None
    assert rerun_after("train_model", 1, PREEMPTED, 0, 3) is None


def test_two_preemptions_run_again_in_the_same_try_each_logging_one_line(capsys):
    op = FakeOperator(task_id="fake", times=2, max_preemptions=3)
    assert op.execute(context()) == {"runs": 3}
    out = capsys.readouterr().out  # the task log (Airflow's structured logger writes it here)
    lines = [line for line in out.splitlines() if "(preemption " in line]
    assert [line.split("(preemption ")[1][:14] for line in lines] == ["1 of at most 3", "2 of at most 3"]
    assert all(f"fake: {PREEMPTED} (preemption" in line for line in lines) and "Traceback" not in out


def test_one_preemption_over_the_bound_fails_in_one_line_that_never_says_will_retry_on_the_last_try():
    from airflow.sdk.exceptions import AirflowException

    op = FakeOperator(task_id="fake", times=5, max_preemptions=1)
    with pytest.raises(AirflowException) as last:
        op.execute(context(try_number=2, retries=1))
    assert str(last.value) == f"fake exited 75 (transient, no retry left): {PREEMPTED}"
    with pytest.raises(AirflowException) as first:
        FakeOperator(task_id="fake", times=5, max_preemptions=0).execute(context(try_number=1, retries=1))
    assert "(transient, will retry)" in str(first.value)


@pytest.mark.parametrize(("taken", "fires"), [(0, True), (1, True), (2, False)])
def test_the_preempt_fault_with_times_fires_in_that_many_runs_of_a_try(monkeypatch, taken, fires):
    from trainpipe.training.faults import Fault

    monkeypatch.setenv("TRAINPIPE_FAULT", "preempt:3:2")
    monkeypatch.setenv("TRAINPIPE_PREEMPTION", str(taken))
    monkeypatch.delenv("TRAINPIPE_TRY_NUMBER", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("TRAINPIPE_ATTEMPT", raising=False)
    assert (Fault.from_env().kind == "preempt") is fires
