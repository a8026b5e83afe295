"""A preemption is said in one line, not as an error: the step's own (``trainpipe <step>: preempted …``) and, on
Airflow, where the operator runs the step again, the operator's line in its place. A task Airflow stops is not run
again as though it were preempted, and a runner killed outright leaves nothing in the temp folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from trainpipe.contract import entrypoint
from trainpipe.contract.errors import InputError, Preempted
from trainpipe.faces.airflow_operator import TrainpipeOperator

pytestmark = pytest.mark.unit

PREEMPTED = "preempted by SIGTERM at step 3: a retry resumes from ckpt-0000000003"


class NoSettings(BaseModel):
    pass


def _said(capfd, exc: Exception) -> tuple[int, list[str]]:
    def core(config: Any, lineage: Any, runtime: Any) -> Any:
        raise exc

    code = entrypoint.run("fake", NoSettings, core, argv=[])
    return code, [line for line in capfd.readouterr().err.splitlines() if line.strip()]


def test_a_preempted_step_says_one_line_that_is_not_an_error(capfd):
    code, lines = _said(capfd, Preempted(PREEMPTED, step=3))
    assert (code, lines) == (75, [f"trainpipe fake: {PREEMPTED}"])
    stopped = "stopped by SIGTERM: a retry of this run continues the study"  # tune_model's words
    assert _said(capfd, Preempted(stopped))[1] == [f"trainpipe fake: preempted: {stopped}"]
    assert _said(capfd, InputError("epochs: must be at least 1"))[1] == [
        "trainpipe fake: error: epochs: must be at least 1"
    ]


def test_trainpipe_run_reads_the_preemption_line_as_the_steps_failure_line():
    from trainpipe.app.cli import FAILURE_LINE, STEP_LINE

    line = f"trainpipe train_model: {PREEMPTED}"
    assert STEP_LINE.search(line) and FAILURE_LINE.search(STEP_LINE.search(line).group(0))  # type: ignore[union-attr]


#: A step preempted in its first TIMES runs: it says its line as the entrypoint does and writes its record.
STEP = """
import json, os, sys
times, record = int(sys.argv[1]), sys.argv[2]
if int(os.environ["TRAINPIPE_PREEMPTION"]) < times:
    print("trainpipe fake: " + sys.argv[3], file=sys.stderr)
    with open(record, "w") as fh:
        json.dump({"component": "fake", "exit_code": 75, "message": sys.argv[3]}, fh)
    sys.exit(75)
print(json.dumps({"runs": int(os.environ["TRAINPIPE_PREEMPTION"]) + 1}))
"""


class FakeOperator(TrainpipeOperator):
    component: ClassVar[str] = "fake"

    def __init__(self, *, times: int, step: str = STEP, **kwargs: Any) -> None:
        super().__init__(settings={}, **kwargs)
        self.times, self.step = times, step

    def command(self, context: Any, error_record: str | None = None) -> list[str]:
        return [sys.executable, "-c", self.step, str(self.times), str(error_record), PREEMPTED]


def context() -> dict[str, Any]:
    return {"run_id": "manual__1", "ti": SimpleNamespace(try_number=1, task=SimpleNamespace(retries=1))}


def test_on_airflow_each_preemption_is_one_line(capsys):
    assert FakeOperator(task_id="fake", times=2, max_preemptions=3).execute(context()) == {"runs": 3}
    said = [line for line in capsys.readouterr().out.splitlines() if "preempted by SIGTERM at step 3" in line]
    assert len(said) == 2 and all("(preemption " in line and "error" not in line for line in said), said


def test_on_airflow_a_preemption_over_the_bound_is_the_steps_line_once(capsys):
    from airflow.sdk.exceptions import AirflowException

    with pytest.raises(AirflowException):
        FakeOperator(task_id="fake", times=1, max_preemptions=0).execute(context())
    said = [line for line in capsys.readouterr().out.splitlines() if "preempted by SIGTERM at step 3" in line]
    assert len(said) == 1 and f"trainpipe fake: {PREEMPTED}" in said[0], said


#: A step that checkpoints when told to stop (SIGTERM: exit 75, its record written) and, run again, ends well at once.
STOPPABLE = """
import json, os, signal, sys, time
record, ready = sys.argv[2], sys.argv[4]
if int(os.environ["TRAINPIPE_PREEMPTION"]):
    print(json.dumps({"ran_again": True}))
    sys.exit(0)
def stop(signum, frame):
    time.sleep(0.3)  # its checkpoint
    with open(record, "w") as fh:
        json.dump({"component": "fake", "exit_code": 75, "message": sys.argv[3]}, fh)
    print("trainpipe fake: " + sys.argv[3], file=sys.stderr)  # a killed runner reads it no more: a broken pipe
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
open(ready, "w").close()
while True:
    time.sleep(0.05)
"""


class StoppableOperator(FakeOperator):
    def __init__(self, *, ready: Path, **kwargs: Any) -> None:
        super().__init__(times=1, step=STOPPABLE, **kwargs)
        self.ready = ready

    def command(self, context: Any, error_record: str | None = None) -> list[str]:
        return [*super().command(context, error_record), str(self.ready)]


def _until(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_task_airflow_stops_is_not_run_again_as_a_preemption(tmp_path):
    """Airflow's task runner calls on_kill on SIGTERM ("mark failed", a timeout): the step checkpoints and exits 75
    saying "preempted by SIGTERM"; the task must then end, not start its step again."""
    from airflow.sdk.exceptions import AirflowException

    op = StoppableOperator(task_id="fake", ready=tmp_path / "ready", max_preemptions=3)
    ended: list[Any] = []

    def run() -> None:
        try:
            ended.append(op.execute(context()))
        except AirflowException as exc:
            ended.append(exc)

    task = threading.Thread(target=run)
    task.start()
    _until((tmp_path / "ready").exists, "the step did not start")
    op.on_kill()
    task.join(timeout=60)
    assert ended and isinstance(ended[0], AirflowException), ended
    assert "exited 75" in str(ended[0]) and PREEMPTED in str(ended[0])


#: The Airflow task process: the operator, as Airflow's task runner holds it (on SIGKILL nothing of it runs again).
RUNNER = """
import json, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.unit.test_preemption_line import StoppableOperator, context
StoppableOperator(task_id="fake", ready=Path({ready!r})).execute(context())
"""


def test_a_runner_killed_outright_leaves_nothing_in_the_temp_folder(tmp_path):
    """The step outlives its killed runner long enough to checkpoint and write its error record (the lifeline
    sends it SIGTERM): written into a folder of the temp folder, nobody would ever remove it."""
    import psutil

    temp, ready = tmp_path / "temp", tmp_path / "ready"
    temp.mkdir()
    repo = str(Path(__file__).resolve().parents[2])
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER.format(repo=repo, ready=str(ready))],
        env={
            **os.environ,
            "TMPDIR": str(temp),
            "PYTHONPATH": os.pathsep.join([*filter(None, [os.environ.get("PYTHONPATH")]), repo]),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _until(lambda: ready.exists() or runner.poll() is not None, "the step did not start")
        assert runner.poll() is None, runner.communicate()[1][-3000:]
        step = psutil.Process(runner.pid).children(recursive=True)
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        psutil.wait_procs(step, timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
    left = {p.relative_to(temp).as_posix() for p in temp.rglob("*")}
    assert not left, f"left in the temp folder: {sorted(left)}"
