"""How a training step ends, in process: a team's exception as one line that keeps the whole error for the
log, where a budget's stop left the run, and the platform's stop while no rank trains (exit 75, never a
signal's death). The real processes are in tests/integration (test_team_code.py, test_preemption.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainpipe.components.train_model import core
from trainpipe.contract.errors import BudgetReached, UserCodeError
from trainpipe.training.control import PlatformStop, Stopped
from trainpipe.training.worker import team_error

pytestmark = pytest.mark.unit

#: A message of any shape a team's code raises: several lines, long ones, blank ones, unicode, none at all.
messages = st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=400), max_size=5).map("\n".join)


def _raise_in_a_helper(message: str) -> None:
    raise ValueError(message)


@given(message=messages)
def test_a_teams_exception_is_one_line_and_its_whole_message_and_traceback_travel_for_the_log(message):
    try:
        _raise_in_a_helper(message)
    except ValueError as exc:
        error = team_error(exc, "tests.fake:train")
    line = str(error)
    first = (message.strip().splitlines() or [""])[0]
    assert isinstance(error, UserCodeError) and len(line.splitlines()) == 1
    assert line.startswith(f"train_function: tests.fake:train raised ValueError: {first[:300]}")
    assert line.endswith("in _raise_in_a_helper)"), line  # where in the team's code
    whole = message.strip().splitlines()
    assert (" …" in line) == (len(whole) > 1 or len(first) > 300), "a cut message says it was cut"
    assert error.detail.startswith("Traceback (most recent call last):")
    raised = f"ValueError: {message}" if message else "ValueError"
    assert "in _raise_in_a_helper" in error.detail and raised.rstrip() in error.detail


def test_the_launcher_prints_the_teams_whole_error_above_its_one_line(tmp_path, capsys):
    """The rank's record carries the traceback; the step prints it to the log, then fails with the one line."""
    from trainpipe.components.train_model.spec import TrainModelConfig

    csv = tmp_path / "d.csv"
    csv.write_text("a,label\n1,0\n")
    config = TrainModelConfig(data=str(csv), output_dir=str(tmp_path / "m"), train_function="teampkg.bad:raises")
    errors = tmp_path / "m" / ".errors"
    errors.mkdir(parents=True)
    detail = 'Traceback (most recent call last):\n  File "bad.py", line 3, in raises\nValueError: one\ntwo'
    record = {"type": "UserCodeError", "message": "train_function: raised ValueError: one …", "exit_code": 2}
    (errors / "rank0.json").write_text(json.dumps({**record, "detail": detail}))
    with pytest.raises(UserCodeError, match="^train_function: raised ValueError: one …$"):
        core._failed(config, tmp_path / "m", 2, [errors / "rank0.json"], None, None)
    assert capsys.readouterr().err.endswith(f"teampkg.bad:raises raised (its whole error):\n{detail}\n")


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ({"step": 11, "checkpoint": "ckpt-0000000011"}, "stopped at step 11 with a checkpoint: a rerun with a larger "),
        ({"step": 0, "checkpoint": None}, "stopped at step 0: no checkpoint was written, so a rerun with a larger "),
        ({"step": 4, "checkpoint": None}, "stopped at step 4: no checkpoint was written"),  # no ctx.restore
        (None, "stopped: a rerun with a larger budget resumes from the newest checkpoint, if one was written (on "),
    ],
    ids=["with-checkpoint", "before-the-first-step", "no-state", "ranks-silent"],
)
def test_a_budgets_stop_says_where_it_left_the_run(record, said, tmp_path):
    """From what the ranks recorded (the step, the checkpoint), not from their message's words."""
    from trainpipe.components.train_model.spec import TrainModelConfig

    csv = tmp_path / "d.csv"
    csv.write_text("a,label\n1,0\n")
    config = TrainModelConfig(data=str(csv), output_dir=str(tmp_path / "m"))
    paths = []
    if record is not None:
        (tmp_path / "m" / ".errors").mkdir(parents=True)
        paths = [tmp_path / "m" / ".errors" / "rank0.json"]
        paths[0].write_text(
            json.dumps({"type": "Preempted", "message": "preempted by SIGTERM", "exit_code": 75, **record})
        )
    with pytest.raises(BudgetReached) as err:
        core._failed(config, tmp_path / "m", 75, paths, None, "max_cost: spent 5 EUR of 5 EUR")
    assert str(err.value).startswith(f"max_cost: spent 5 EUR of 5 EUR; {said}"), str(err.value)
    assert ("resumes from ckpt-0000000011" in str(err.value)) == bool(record and record["checkpoint"])


def test_the_platforms_stop_while_no_rank_trains_raises_where_the_step_is_and_only_once():
    before = signal.getsignal(signal.SIGTERM)
    with PlatformStop() as stop:
        with pytest.raises(Stopped) as got:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**6):  # the handler runs between two bytecodes of this thread
                pass
        os.kill(os.getpid(), signal.SIGUSR1)  # a second signal while it stops changes nothing
    assert got.value.signal == "SIGTERM" == stop.signal
    assert signal.getsignal(signal.SIGTERM) is before  # put back as it was


def test_a_signal_the_ranks_finished_before_acting_on_goes_to_the_step(tmp_path):
    """The ranks exit 0 (they had passed their last control point): the launcher hands the platform's
    signal to the handler that was there before it, once; a budget's own stop is not handed on."""
    from trainpipe.training.launch import Plan, run_plan

    ready, go = tmp_path / "ready", tmp_path / "go"
    child = ["sh", "-c", f"touch {ready}; while [ ! -e {go} ]; do sleep 0.02; done"]
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _f: seen.append(signum))

    def send_then_release() -> bool:  # the launcher's budget poll, used here as a hook into its wait
        if ready.exists() and not go.exists():
            os.kill(os.getpid(), signal.SIGTERM)
            go.touch()
        return False

    try:
        assert run_plan(Plan([child], [{}], 0, "t"), tmp_path / "errors", budget=send_then_release) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM]


@pytest.mark.parametrize("checkpoints", [[], [3, 12]], ids=["none", "two"])
def test_a_stop_outside_the_ranks_says_where_a_retry_resumes(tmp_path, checkpoints):
    from trainpipe.components.train_model.spec import TrainModelConfig

    csv = tmp_path / "d.csv"
    csv.write_text("a,label\n1,0\n")
    out = tmp_path / "m"
    for step in checkpoints:
        (out / "checkpoints" / f"ckpt-{step:010d}").mkdir(parents=True)
    (out / "model.safetensors").parent.mkdir(parents=True, exist_ok=True)
    (out / "model.safetensors").write_bytes(b"half")
    stop = PlatformStop()
    stop.when = "after its ranks' last step, before the model was logged"
    error = core._stopped(TrainModelConfig(data=str(csv), output_dir=str(out)), stop, "SIGTERM")
    kept = "a retry resumes from ckpt-0000000012" if checkpoints else "a retry starts over"
    assert str(error) == f"preempted by SIGTERM after its ranks' last step, before the model was logged: {kept}"
    assert error.exit_code == 75 and not (out / "model.safetensors").exists()  # nothing half-made is left


def test_a_stop_after_a_rank_failed_on_bad_input_is_that_failure_not_a_preemption(tmp_path):
    """A new user's run: the rank refused the label column, then SIGTERM came while the step wound up; it
    exited 75 ("preempted ... a retry starts over"), so Airflow and KFP retried what would fail again."""
    from trainpipe.components.train_model.spec import TrainModelConfig
    from trainpipe.contract.errors import InputError

    csv = tmp_path / "d.csv"
    csv.write_text("a,label\n1,0\n")
    out = tmp_path / "m"
    (out / core.ERRORS_DIR).mkdir(parents=True)
    message = "label_column: 'label' is not a column of the data (columns: a)"
    (out / core.ERRORS_DIR / "rank0.json").write_text(json.dumps({"type": "InputError", "message": message}))
    stop = PlatformStop()
    stop.when = "after its ranks' last step, before the model was logged"
    error = core._stopped(TrainModelConfig(data=str(csv), output_dir=str(out)), stop, "SIGTERM")
    assert isinstance(error, InputError) and str(error) == message and error.exit_code == 2
    assert not (out / core.ERRORS_DIR).exists()


def test_the_ranks_pid_files_stay_in_the_runs_folder(tmp_path):
    """They lived in a ``trainpipe-ranks-*`` folder of the system's temp folder, which a launcher killed outright
    left behind there (a deployment trial found one): now beside the run's error records, cleared after the run,
    and a stale one of this host whose launcher is gone is cleared by the next; the folders of the run's other
    nodes (a multi-node run shares its output folder) and of a live launcher are kept."""
    import socket
    import tempfile

    from trainpipe.training.launch import RANK_PIDS_PREFIX, Plan, run_plan

    host = socket.gethostname()
    stale = tmp_path / f"{RANK_PIDS_PREFIX}{host}-99999999"  # its launcher is gone
    stale.mkdir()
    live = tmp_path / f"{RANK_PIDS_PREFIX}{host}-{os.getppid()}"  # another node's or launcher's, still running
    live.mkdir()
    other = tmp_path / f"{RANK_PIDS_PREFIX}another-host-1"  # a node of the same run on another host
    other.mkdir()
    seen = tmp_path / "seen"
    child = ["sh", "-c", f'test -d "$TRAINPIPE_RANK_PIDS" && echo "$TRAINPIPE_RANK_PIDS" > {seen}']
    before = set(Path(tempfile.gettempdir()).glob("trainpipe-ranks-*"))
    assert run_plan(Plan([child], [{}], 0, "t"), tmp_path / "errors") == 0
    assert set(Path(tempfile.gettempdir()).glob("trainpipe-ranks-*")) == before
    assert seen.read_text().strip() == str(tmp_path / f"{RANK_PIDS_PREFIX}{host}-{os.getpid()}")
    assert sorted(tmp_path.glob(f"{RANK_PIDS_PREFIX}*")) == sorted([live, other]), "its own and the stale one gone"
