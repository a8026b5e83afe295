"""The training loop driver (trainpipe.training.loop) on a framework-free backend: the order of
batches and a resume mid-epoch, epoch means, checkpoint cadence, preemption, step records that add
up; and the control points' agreement between ranks."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from tests.unit.test_checkpoint import DictState
from trainpipe.contract.errors import Preempted
from trainpipe.training import control
from trainpipe.training.context import BaseContext
from trainpipe.training.control import Control
from trainpipe.training.timing import StepTimer, step_record

pytestmark = pytest.mark.unit

ROWS, BATCH = 40, 8  # 5 steps an epoch


class HostPlacement:
    def place(self, arrays):
        return [np.asarray(a) for a in arrays]

    def gather(self, arrays, rows):
        for r in rows:
            yield [a[r] for a in arrays]

    def from_host(self, batches):
        yield from batches

    def other(self, source, settings, rank, world):
        raise AssertionError("not used")


class FakeContext(BaseContext):
    """One rank, host numbers, a dict for a model: what the loop does, without a framework."""

    framework = "fake"

    def __init__(self, settings) -> None:
        super().__init__(settings, rank=0, world_size=1, local_rank=0, dist_name="none")

    def _all_reduce_sum(self, values):
        return list(values)

    def _placement(self):
        return HostPlacement()

    def _state_io(self, objects):
        return DictState(objects["model"])

    def _save_model(self, *args) -> None:
        pass

    def step(self) -> None:
        self.timer.mark("step_start")
        self.timer.mark("step_end")
        self._count_step()


@pytest.fixture
def settings(tmp_path):
    from trainpipe.components.train_model.spec import TrainModelConfig

    csv = tmp_path / "rows.csv"
    csv.write_text("a,label\n" + "".join(f"{i},{i % 2}\n" for i in range(ROWS)))

    def make(**extra):
        base = {
            "data": str(csv),
            "output_dir": str(tmp_path / "out"),
            "batch_size": BATCH,
            "nproc_per_node": 1,
            "epochs": 2,
            "checkpoint_every_s": 0,
        }
        return TrainModelConfig.model_validate({**base, **extra})

    return make


def train(settings, stop_after: int | None = None, on_batch=None):
    """Run the fake training; the batches seen (their row ids) and the context."""
    ctx = FakeContext(settings)
    model = {"sum": 0.0}
    ctx.restore(model=model)
    rows = np.arange(ROWS, dtype=np.float64)
    seen = []
    for (x,) in ctx.batches((rows,)):
        if stop_after is not None and ctx.global_step == stop_after:
            break  # the rank dies here
        if on_batch is not None:
            on_batch(ctx)
        model["sum"] += float(x.sum())
        ctx.step()
        ctx.log(loss=float(x.mean()))
        seen.append(x.tolist())
    ctx.wait_for_checkpoints()
    return seen, ctx, model


def test_a_run_killed_mid_epoch_resumes_after_its_checkpoint_with_the_same_batches_and_means(settings):
    whole, ctx, model = train(settings(checkpoint_every_steps=3))
    assert len(whole) == 10 and sorted(r for b in whole[:5] for r in b) == sorted(
        range(ROWS)
    )  # an epoch sees every row once
    assert [h["step"] for h in ctx.metrics.history] == [5, 10]
    expected_means = [np.mean(whole[:5]), np.mean(whole[5:])]
    assert [h["loss"] for h in ctx.metrics.history] == pytest.approx(expected_means)
    assert ctx.checkpoints.last_step == 10  # the last step always checkpoints

    again = settings(checkpoint_every_steps=3, output_dir=str(Path(settings().output_dir).parent / "again"))
    first, _, _ = train(again, stop_after=7)  # the checkpoints at 3 and 6 were written
    resumed, ctx2, model2 = train(again)
    assert ctx2.resumed_from == 6 and first[:6] + resumed == whole
    assert model2["sum"] == model["sum"]  # the state resumed from step 6's copy, not from where the run died
    assert [h["loss"] for h in ctx2.metrics.history] == pytest.approx(
        expected_means
    )  # the partial epoch's sums travelled


def test_a_checkpoint_written_while_an_epoch_ends_holds_the_history_and_sums_of_its_own_step(settings, monkeypatch):
    """The writer renames a checkpoint after the loop went on: its trainer.json is the state of its step, not of
    the epoch that ended meanwhile (a resume from it wrote that epoch's line twice, the second from counted sums)."""
    slow = lambda self, objects: DictState(objects["model"], write_delay=0.3)  # noqa: E731
    whole, ctx, _ = train(settings(checkpoint_every_steps=4))
    monkeypatch.setattr(FakeContext, "_state_io", slow)
    again = settings(checkpoint_every_steps=4, output_dir=str(Path(settings().output_dir).parent / "slow"))
    train(again, stop_after=7)  # step 4's checkpoint was still being written when epoch 1 ended at step 5
    kept = json.loads((Path(again.output_dir) / "checkpoints" / "ckpt-0000000004" / "trainer.json").read_text())
    assert kept["history"] == [] and {k: v[1] for k, v in kept["carried"].items()} == {"loss": 4.0}
    monkeypatch.undo()
    _, ctx2, _ = train(again)
    assert ctx2.resumed_from == 4 and ctx2.metrics.history == ctx.metrics.history
    lines = (Path(again.output_dir) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == ctx.metrics.history


def test_an_epoch_end_checkpoints_only_when_the_interval_passed(settings, tmp_path):
    _, quick, _ = train(settings(checkpoint_every_s=3600))
    assert quick.checkpoints.saves == 1 and quick.checkpoints.last_step == 10  # the last step only
    slow = settings(checkpoint_every_s=0.05, output_dir=str(tmp_path / "slow"))
    _, ctx, _ = train(slow, on_batch=lambda c: time.sleep(0.03))
    # due by time at a control point (before the first batch, after the first, at epoch ends)
    assert 2 <= ctx.checkpoints.saves < 10


def test_a_preemption_checkpoints_the_step_it_ends_and_raises_exit_75(settings):
    control._received.clear()

    def signal_at_step_2(ctx) -> None:
        if ctx.global_step == 2:
            control._on_signal(signal.SIGTERM, None)

    try:
        with pytest.raises(Preempted) as err:
            train(settings(), on_batch=signal_at_step_2)
    finally:
        control._received.clear()
    assert err.value.exit_code == 75
    message = str(err.value)
    assert message.startswith("preempted by SIGTERM at step ") and "a retry resumes from ckpt-" in message
    step = int(message.split("at step ")[1].split(":")[0])
    ckpt = Path(settings().output_dir) / "checkpoints" / f"ckpt-{step:010d}"
    assert ckpt.is_dir() and json.loads((ckpt / "trainer.json").read_text())["global_step"] == step


def test_step_records_are_contiguous_and_their_phases_add_up(settings, monkeypatch):
    """On a clock that moves one millisecond each time it is read (whatever the machine's load), the steps'
    times add up to the loop's: each batch starts where the last one ended, its epoch end and checkpoint
    included; only the reads before its first step and after its last are outside them."""
    from types import SimpleNamespace

    from trainpipe.training import loop as loop_mod
    from trainpipe.training import timing

    reads = iter(range(10**9))
    clock = SimpleNamespace(perf_counter=lambda: next(reads) / 1000, time=time.time, sleep=time.sleep)
    monkeypatch.setattr(timing, "time", clock)
    monkeypatch.setattr(loop_mod, "time", clock)
    t0 = clock.perf_counter()
    _, ctx, _ = train(settings(checkpoint_every_steps=2))
    wall = clock.perf_counter() - t0
    recs = ctx.step_records
    assert len(recs) == 10
    for r in recs:
        phases = r["data_s"] + r["forward_s"] + r["backward_s"] + r["optimizer_s"] + r["other_s"]
        assert phases == pytest.approx(r["step_s"], abs=1e-9)
    total = sum(r["step_s"] for r in recs)
    # a gap at each of the 9 step boundaries (or at the 5 checkpoints) would leave at least that many reads out
    assert 0 < wall - total <= 0.004, (wall, total)


def test_a_step_record_from_its_marks():
    at = {
        "start": 0.0,
        "ready": 1.0,
        "backward_start": 3.0,
        "backward_end": 6.0,
        "step_start": 7.0,
        "step_end": 9.0,
        "done": 10.0,
    }
    assert step_record(at, "torch") == {
        "data_s": 1.0,
        "forward_s": 2.0,
        "backward_s": 3.0,
        "optimizer_s": 2.0,
        "other_s": 2.0,
        "step_s": 10.0,
    }
    assert (
        step_record({"start": 0.0, "ready": 1.0, "back": 4.0, "done": 5.0}, "torch")["forward_s"] == 3.0
    )  # accumulation: no step
    tf = step_record({"start": 0.0, "ready": 1.0, "step_start": 2.0, "step_end": 6.0, "done": 7.0}, "tensorflow")
    assert tf == {"data_s": 1.0, "compute_s": 4.0, "other_s": 2.0, "step_s": 7.0}


def test_the_host_timer_gives_the_time_after_a_batch_to_that_batch():
    timer = StepTimer("torch", time.perf_counter())
    timer.begin()
    for _ in range(3):
        timer.batch_start()
        timer.mark("ready")
        timer.mark("back")
        timer.finish_batch(0, 0, 1)
    time.sleep(0.02)
    timer.extend_last()
    assert timer.records[-1]["other_s"] >= 0.02 and timer.records[-1]["step_s"] >= 0.02


def test_control_points_agree_on_what_one_rank_knows_and_schedule_alike():
    control._received.clear()
    ranks = [Control(world_size=2, every_s=1.0), Control(world_size=2, every_s=1.0)]
    # rank 1 caught SIGUSR1 (Slurm's warning); rank 0 did not, and its clock says the interval passed
    sums = [1 * 0.0, 1.0, 1.0, 0.02]  # what the all-reduce returns on both: [sigterm, sigusr1, time due, elapsed]
    decisions = [c.agree(10, time_due=False, all_reduce_sum=lambda local: sums) for c in ranks]
    assert decisions[0] == decisions[1] and decisions[0].preempt == "SIGUSR1" and decisions[0].time_due
    # the next point: 10 batches took 0.01 s a rank, so about a second is 1000 batches, capped at 10x the last interval
    assert [c._next for c in ranks] == [20, 20]
    assert ranks[0].due(20) and not ranks[0].due(19)
    quiet = Control(world_size=1).agree(0, time_due=False, all_reduce_sum=lambda local: local)
    assert quiet.preempt is None and not quiet.time_due


# --- the table of the work between batches --------------------------------------------------------

import itertools  # noqa: E402

from trainpipe.training.control import Decision  # noqa: E402
from trainpipe.training.loop import BatchEnd, Due, due_after, due_now  # noqa: E402

#: every batch end the loop can meet: the run's last batch ends its epoch, unless the function left the loop
#: mid-epoch after it (a break: then it is the run's last)
ENDS = [
    BatchEnd(stepped, ends_epoch, last, control_point, left)
    for stepped, ends_epoch, last, control_point, left in itertools.product([False, True], repeat=5)
    if (ends_epoch or left or not last) and (last or not left)
]
AGREED = [None, Decision(None, False), Decision(None, True), Decision("SIGTERM", False), Decision("SIGUSR1", True)]


def test_a_plain_batch_is_followed_by_nothing():
    plain = BatchEnd(stepped=True, ends_epoch=False, last=False, control_point=False)
    assert due_now(plain) == Due() and due_after(plain, None, steps_due=False) == Due()


@pytest.mark.parametrize("end", ENDS, ids=str)
def test_an_epoch_end_is_a_control_point_and_only_a_control_point_agrees(end):
    now = due_now(end)
    assert now.end_epoch == end.ends_epoch  # a function that left mid-epoch ends its partial epoch
    assert now.agree == (end.ends_epoch or end.control_point or end.left)  # leaving is the run's end: the ranks meet


#: every batch end with every answer the ranks can give there (they meet only at a control point)
MEETINGS = [(e, a, s) for e, a, s in itertools.product(ENDS, AGREED, [False, True]) if a is None or due_now(e).agree]


@pytest.mark.parametrize(("end", "agreed", "steps_due"), MEETINGS, ids=str)
def test_each_reason_to_checkpoint_checkpoints_and_only_a_preemption_stops(end, agreed, steps_due):
    due = due_after(end, agreed, steps_due)
    reasons = [
        end.last,
        end.left,
        agreed is not None and agreed.preempt is not None,
        agreed is not None and agreed.time_due,
        end.stepped and steps_due,
    ]
    assert due.checkpoint == any(reasons)
    assert due.stop == (agreed.preempt if agreed is not None else None)
    assert not due.stop or due.checkpoint, "a stop always comes after this step's checkpoint"
    assert due.mid_epoch == (due.checkpoint and not (end.ends_epoch or end.left))  # the partial sums travel with it
    assert due.final == end.left, "a function's leaving is written as the run's end, and only that"
    assert (due.end_epoch, due.agree) == (due_now(end).end_epoch, due_now(end).agree)


def test_the_last_batch_checkpoints_even_when_nothing_else_asks():
    last = BatchEnd(stepped=False, ends_epoch=True, last=True, control_point=False)
    assert due_after(last, Decision(None, False), steps_due=False) == Due(True, True, True, False, False, None)
    stopped = due_after(last, Decision("SIGTERM", False), steps_due=False)
    assert stopped.checkpoint and stopped.stop == "SIGTERM"  # a preemption at the last step: saved, then stop


def test_metrics_jsonl_holds_each_epoch_as_it_ends_and_a_resumed_run_replaces_what_an_attempt_left(settings):
    """Epoch ends append their line (a study reads the file while the run trains); the first write of a
    resumed process replaces the file, so lines a failed attempt wrote past its checkpoint, or half a line,
    are gone and the file is the uninterrupted run's."""
    s = settings(epochs=4, checkpoint_every_steps=3)
    jsonl = Path(s.output_dir) / "metrics.jsonl"
    lines_seen = []
    whole, ctx, _ = train(
        s, on_batch=lambda c: lines_seen.append(len(jsonl.read_text().splitlines()) if jsonl.exists() else 0)
    )
    assert lines_seen == [i // 5 for i in range(20)]  # 5 batches an epoch: each epoch's line as it ends
    text = jsonl.read_text()
    assert [json.loads(x) for x in text.splitlines()] == ctx.metrics.history and len(ctx.metrics.history) == 4

    again = settings(epochs=4, checkpoint_every_steps=3, output_dir=str(Path(s.output_dir).parent / "again"))
    train(again, stop_after=12)  # died in the third epoch, its checkpoint at step 12
    left = Path(again.output_dir) / "metrics.jsonl"
    with left.open("a") as fh:  # what a failed attempt may leave past its checkpoint
        fh.write('{"epoch": 7, "step": 99, "loss": 0.0}\n{"epoch": 8, "st')
    _, ctx2, _ = train(again)
    assert ctx2.resumed_from == 12 and left.read_text() == text


def test_a_function_that_leaves_its_loop_ends_the_run_there_whatever_else_is_due():
    """A ``break`` after a step, mid-epoch (early stopping): its partial epoch ends, the checkpoint is final and
    carries no partial sums; one right after an epoch's end, before a step, ends no epoch; a signal still stops."""
    mid = BatchEnd(stepped=True, ends_epoch=True, last=True, control_point=False, left=True)
    assert due_after(mid, Decision(None, False), steps_due=False) == Due(True, True, True, False, True, None)
    fresh = BatchEnd(stepped=False, ends_epoch=False, last=True, control_point=False, left=True)
    assert due_now(fresh) == Due(agree=True)
    assert due_after(fresh, Decision("SIGTERM", False), steps_due=False) == Due(
        False, True, True, False, True, "SIGTERM"
    )


# --- early stopping: a function that leaves its loop ---------------------------------------------------

from hypothesis import HealthCheck, given  # noqa: E402
from hypothesis import settings as examples  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def train_leaving(settings, leave_at: int, before_step: bool = False, fail: bool = False):
    """A function with early stopping: at global step ``leave_at`` it leaves its loop (``break``), after that
    step or, with ``before_step``, in the next batch before stepping; then it saves its model and returns and
    the worker finishes. With ``fail`` it raises there instead (the worker does not finish). The batches it
    stepped (their row ids) and the context."""
    ctx = FakeContext(settings)
    model = {"sum": 0.0}
    ctx.restore(model=model)
    seen = []
    try:
        for (x,) in ctx.batches((np.arange(ROWS, dtype=np.float64),)):
            if before_step and ctx.global_step == leave_at:
                if fail:
                    raise ValueError("the team's code broke")
                break
            model["sum"] += float(x.sum())
            ctx.step()
            ctx.log(loss=float(x.mean()))
            seen.append(x.tolist())
            if not before_step and ctx.global_step == leave_at:
                if fail:
                    raise ValueError("the team's code broke")
                break
        ctx.save_model(model)
    except ValueError:
        ctx.close()
        return seen, ctx
    ctx.finish()
    return seen, ctx


def lines(settings) -> list[dict]:
    path = Path(settings.output_dir) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def final_checkpoint(settings) -> dict:
    newest = sorted((Path(settings.output_dir) / "checkpoints").glob("ckpt-*"))[-1]
    return json.loads((newest / "trainer.json").read_text())


@examples(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    epochs=st.integers(1, 3),
    batch=st.sampled_from([4, 8, 10]),
    every_steps=st.sampled_from([0, 1, 3]),
    where=st.floats(0, 1, exclude_max=True),
    before_step=st.booleans(),
)
def test_leaving_the_loop_early_keeps_the_partial_epoch_and_a_final_checkpoint_a_rerun_does_not_train_past(
    settings, tmp_path_factory, epochs, batch, every_steps, where, before_step
):
    """Early stopping at any step of any run shape (an epoch's first or last batch, before or after its step):
    metrics.jsonl holds one line per epoch begun, each the mean of exactly the batches stepped in it; the newest
    checkpoint is the step the function left at, marked final; a rerun resumes there, is handed no batch, and
    ends with the same history; the worker's finish accepts both."""
    per_epoch = ROWS // batch
    total = per_epoch * epochs
    leave_at = 1 + int(where * (total - 1)) if not before_step else int(where * total)
    if before_step and leave_at == 0:
        leave_at = 1  # a function that never stepped is refused: another test
    out = tmp_path_factory.mktemp("leave") / "out"
    s = settings(epochs=epochs, batch_size=batch, checkpoint_every_steps=every_steps, output_dir=str(out))
    seen, ctx = train_leaving(s, leave_at, before_step)
    assert ctx.global_step == leave_at == len(seen)
    by_epoch = [seen[e * per_epoch : (e + 1) * per_epoch] for e in range(epochs)]
    expected = [{"epoch": e, "loss": np.mean(b)} for e, b in enumerate(by_epoch) if b]
    got = lines(s)
    assert [(x["epoch"], x["loss"]) for x in got] == [(x["epoch"], pytest.approx(x["loss"])) for x in expected]
    assert got[-1]["step"] == leave_at
    trainer = final_checkpoint(s)
    assert trainer["global_step"] == leave_at and trainer["ended"] and trainer["carried"] == {}
    assert trainer["history"] == got
    telemetry = json.loads((out / "telemetry" / "rank0.json").read_text())
    assert telemetry["resumed_from_step"] == 0 and len(telemetry["steps"]) == leave_at
    again, ctx2 = train_leaving(s, leave_at=-1)  # the rerun: nothing to leave, nothing handed out
    assert again == [] and ctx2.resumed_from == leave_at and ctx2.global_step == leave_at
    assert lines(s) == got and ctx2.step_records == []
    rerun = json.loads((out / "telemetry" / "rank0.json").read_text())  # what the result reads: this run's place
    assert rerun["resumed_from_step"] == leave_at and rerun["steps"] == telemetry["steps"]  # steps: the training's


def test_an_exception_in_the_loop_is_no_end_of_the_run(settings):
    """The iterator closes the same way when the function raises: no partial epoch, no final checkpoint; a
    retry resumes from the last periodic checkpoint and trains on."""
    s = settings(checkpoint_every_steps=3)
    _, ctx = train_leaving(s, leave_at=7, fail=True)
    assert ctx.global_step == 7 and lines(s) == [{"epoch": 0, "step": 5, "loss": pytest.approx(lines(s)[0]["loss"])}]
    assert final_checkpoint(s)["global_step"] == 6 and not final_checkpoint(s)["ended"]
    seen, ctx2 = train_leaving(s, leave_at=-1)
    assert ctx2.resumed_from == 6 and len(seen) == 4 and ctx2.global_step == 10


def test_an_iterator_the_function_kept_ends_the_run_when_it_returns(settings):
    """``it = ctx.batches(...)``, a few ``next(it)`` and a return with ``it`` still held (by the context's
    owner here): finish ends the run at the last batch stepped."""
    s = settings()
    ctx = FakeContext(s)
    ctx.restore(model={"sum": 0.0})
    it = ctx.batches((np.arange(ROWS, dtype=np.float64),))
    for _ in range(3):
        next(it)
        ctx.step()
        ctx.log(loss=1.0)
    ctx.save_model({})
    ctx.finish()
    assert lines(s) == [{"epoch": 0, "step": 3, "loss": 1.0}] and final_checkpoint(s)["ended"]


def test_a_preemption_as_the_function_leaves_checkpoints_and_stops(settings):
    control._received.clear()
    s = settings()
    ctx = FakeContext(s)
    ctx.restore(model={"sum": 0.0})
    for _ in ctx.batches((np.arange(ROWS, dtype=np.float64),)):
        ctx.step()
        if ctx.global_step == 2:
            control._on_signal(signal.SIGTERM, None)  # the signal comes between control points
            break
    ctx.save_model({})
    try:
        with pytest.raises(Preempted, match="at step 2: a retry resumes from ckpt-0000000002"):
            ctx.finish()
    finally:
        control._received.clear()
    assert final_checkpoint(s)["ended"]


def test_a_function_on_arrays_of_its_own_keeps_the_classes_of_the_rows_it_read(settings, tmp_path):
    """``x, y = data.x, data.y`` then ``ctx.batches((x, y))``: the classes are those of the rows ctx.data gave;
    a function that encoded its labels itself (no ctx.data rows) is asked for them in one line."""
    from trainpipe.contract.errors import InputError

    csv = tmp_path / "words.csv"
    csv.write_text("a,label\n" + "".join(f"{i},{['zebra', 'ant', 'mole'][i % 3]}\n" for i in range(ROWS)))
    s = settings(data=str(csv))
    ctx = FakeContext(s)
    with pytest.raises(InputError, match=r"^save_model: give classes= ") as err:
        ctx._classes(None, "classification")
    assert "\n" not in str(err.value)
    assert ctx._classes(None, "regression") is None and ctx._classes(["b", "a"], "classification") == ["b", "a"]
    data = ctx.data.table()
    for _ in ctx.batches((data.x, data.y)):  # arrays of its own: not trainpipe's source
        break
    assert ctx._classes(None, "classification") == ["ant", "mole", "zebra"] == data.classes


class _Judge:
    """A judge on the epoch gate's socket (tune_model's pruner stands here): answers ``s`` at one epoch."""

    def __init__(self, path: Path, stop_at: int | None) -> None:
        import socket
        import threading

        self.heard: list[dict] = []
        self.stop_at = stop_at
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                self.heard.append(json.loads(line))
                conn.sendall(b"s" if self.heard[-1]["epoch"] + 1 == self.stop_at else b"c")


@examples(max_examples=8, deadline=None)
@given(epochs=st.integers(1, 4), data=st.data())
def test_the_epoch_gate_stops_the_run_at_the_epoch_its_judge_decided_on(epochs, data):
    """Each epoch's end waits for the judge's answer, so a stop decided on epoch k stops the ranks at k's last
    step (checkpointed, exit 75 as a preemption), never an epoch later; a judge that lets it go on hears every
    epoch once."""
    import tempfile

    from trainpipe.components.train_model.spec import TrainModelConfig

    stop_at = data.draw(st.one_of(st.none(), st.integers(1, epochs)))
    with tempfile.TemporaryDirectory(prefix="gate-") as tmp:
        csv = Path(tmp) / "rows.csv"
        csv.write_text("a,label\n" + "".join(f"{i},{i % 2}\n" for i in range(ROWS)))
        s = TrainModelConfig.model_validate(
            {"data": str(csv), "output_dir": f"{tmp}/out", "batch_size": BATCH, "nproc_per_node": 1, "epochs": epochs}
        )
        judge = _Judge(Path(tmp) / "gate", stop_at)
        control._received.clear()
        try:
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv(control.EPOCH_GATE_ENV, str(Path(tmp) / "gate"))
                if stop_at is None:
                    train(s)
                else:
                    with pytest.raises(Preempted, match=f"at step {5 * stop_at}:"):
                        train(s)
        finally:
            control._received.clear()
        assert [h["epoch"] for h in judge.heard] == list(range(stop_at or epochs))
        assert len((Path(s.output_dir) / "metrics.jsonl").read_text().splitlines()) == (stop_at or epochs)
