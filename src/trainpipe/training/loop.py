"""The training loop's driver, framework-free: where the run is, and what happens between batches.

A training function owns its loop (``for batch in ctx.batches(...)``); the driver runs around it:
how many batches an epoch has and where a resumed run picks up, the epoch ends (metrics reduced
over ranks), the control points where the ranks agree on preemption and on the checkpoint
interval, when a checkpoint is taken (between batches, after the step's ``log`` calls, so a
resumed run reproduces the metrics too), stopping when the platform asks or when the judge at the
epoch gate (a tuning study's pruner) answers an epoch's end with a stop, and the end of a run
whose function left its loop early (a ``break`` on early stopping, a ``return``). One record per
batch goes to the step timer. The context (:mod:`~trainpipe.training.context`) is the function's
API on top of it; the parts it uses each do one job: :mod:`~trainpipe.training.checkpoint`,
:mod:`~trainpipe.training.control`, :mod:`~trainpipe.training.timing`,
:mod:`~trainpipe.training.metrics`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.contract.errors import InputError, Preempted, TrainpipeError
from trainpipe.contract.io import atomic_write_text
from trainpipe.contract.layout import EPOCH_METRICS_FILE
from trainpipe.training import control as control_points
from trainpipe.training import sources
from trainpipe.training.checkpoint import CheckpointManager, StateIO, checkpoint_name
from trainpipe.training.control import Control, Decision, EpochGate
from trainpipe.training.faults import Fault
from trainpipe.training.metrics import EpochMetrics
from trainpipe.training.timing import StepTimer

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig


@dataclass(frozen=True)
class BatchEnd:
    """Where a batch left the run: what the table of the work between batches reads."""

    stepped: bool  # the function took an optimizer step in it
    ends_epoch: bool  # it was its epoch's last batch (or max_steps is reached; or the function left mid-epoch)
    last: bool  # it was the run's last batch
    control_point: bool  # the schedule puts a control point after it (about once a second)
    left: bool = False  # the function left its loop after it (a break, a return): the run ends here


@dataclass(frozen=True)
class Due:
    """The work between two batches, in the order the loop does it."""

    end_epoch: bool = False  # reduce the epoch's metrics over the ranks, write metrics.jsonl, ask the epoch gate
    agree: bool = False  # a control point: the ranks agree on a stop and on the checkpoint clock (a collective)
    checkpoint: bool = False  # write this step's checkpoint, every rank together
    mid_epoch: bool = False  # ... carrying the epoch's partial sums (a resume reproduces the metrics)
    final: bool = False  # ... marked as the run's end: a resume from it has no batch left
    stop: str | None = None  # then stop with exit 75: the signal the ranks agreed on


def due_now(end: BatchEnd) -> Due:
    """What a batch's end asks for before the ranks agree (it needs no collective).

    | the batch                                              | end the epoch | agree |
    |--------------------------------------------------------|---------------|-------|
    | its epoch's last (or the run's)                        | yes           | yes   |
    | the function left its loop after it, mid-epoch         | yes (partial) | yes   |
    | the function left its loop after it, its epoch ended   | no            | yes   |
    | a control point's                                      | no            | yes   |
    | any other                                              | no            | no    |
    """
    return Due(end_epoch=end.ends_epoch, agree=end.ends_epoch or end.control_point or end.left)


def due_after(end: BatchEnd, agreed: Decision | None, steps_due: bool) -> Due:
    """The checkpoint and the stop, once the ranks agreed (``agreed`` is None where they did not meet).

    | after the batch                                         | checkpoint       | stop            |
    |---------------------------------------------------------|------------------|-----------------|
    | the one the function left its loop after (its last)     | yes, final       | if agreed       |
    | the run's last                                          | yes              | if agreed       |
    | the ranks agreed to stop (a preemption signal)          | yes              | its signal      |
    | the ranks agreed the checkpoint interval passed         | yes              | no              |
    | a step the step count makes due (checkpoint_every_steps)| yes              | no              |
    | any other                                               | no               | no              |

    A checkpoint after the batch the function left on is final: a resume from it has no batch left
    (the run ended there, whatever its settings planned), and it carries no partial sums (the
    partial epoch's line was written, or none was under way).
    """
    stop = agreed.preempt if agreed is not None else None
    timed = agreed is not None and agreed.time_due
    save = end.last or end.left or stop is not None or timed or (end.stepped and steps_due)
    first = due_now(end)
    mid_epoch = save and not (end.ends_epoch or end.left)
    return Due(first.end_epoch, first.agree, save, mid_epoch, save and end.left, stop)


class HistoryFile:
    """``metrics.jsonl``: one line per epoch. The first write of a process replaces the file atomically (a resumed
    run's history is its checkpoint's, whatever a failed attempt wrote after it); later epochs append their own
    line in one ``write``, so an epoch end costs one small write, not a rewrite of every line (0.7 ms an epoch
    here, which a small model's short epoch paid on every step). Nothing is fsynced: the checkpoints hold the
    history durably. A reader that opens the file mid-append may see a last line without its newline; tune_model
    reads it again on the next line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: The lines this process wrote; None until its first write, which replaces the file.
        self._lines_written: int | None = None

    def restart(self) -> None:
        """The next write replaces the file (the history was read back from a checkpoint)."""
        self._lines_written = None

    def write(self, history: list[dict[str, Any]]) -> None:
        done = self._lines_written if self.path.is_file() else None
        text = "".join(json.dumps(h, sort_keys=True) + "\n" for h in history[done or 0 :])
        if done is None:
            atomic_write_text(self.path, text, durable=False)
        elif text:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, text.encode("utf-8"))
            finally:
                os.close(fd)
        self._lines_written = len(history)


def preempted(signal_name: str, step: int, ckpt: CheckpointManager | None) -> Preempted:
    """The stop a preemption raises at ``step``, saying what a retry resumes from."""
    written = checkpoint_name(ckpt.last_step) if ckpt is not None and ckpt.last_step is not None else None
    if ckpt is None:
        kept = "the training function registered no state with ctx.restore, so a retry starts over"
    elif written is None:
        kept = "nothing was trained yet, so a retry starts over"
    else:
        kept = f"a retry resumes from {written}"
    return Preempted(f"preempted by {signal_name} at step {step}: {kept}", step=step, checkpoint=written)


class Loop:
    """A rank's position in the run and the work between its batches.

    Args:
        settings: The run's settings (epochs, max_steps, batch size).
        rank, world_size: This rank's place in the job.
        out: The output folder (``metrics.jsonl``).
        timer: The step timer (host clock, or CUDA events).
        metrics: The epoch means of the logged values.
        all_reduce_sum: Host numbers summed over the ranks (the backend's; never waits for a device).
        fault: Fault injection for tests.
        on_batch_end: After each batch's record (the profiler's step).
    """

    def __init__(
        self,
        settings: TrainModelConfig,
        rank: int,
        world_size: int,
        out: Path,
        timer: StepTimer,
        metrics: EpochMetrics,
        all_reduce_sum: Callable[[list[float]], list[float]],
        fault: Fault,
        on_batch_end: Callable[[], None],
    ) -> None:
        self.settings, self.rank, self.world_size, self.out = settings, rank, world_size, out
        self.is_chief = rank == 0
        self.timer, self.metrics, self.all_reduce_sum, self.fault = timer, metrics, all_reduce_sum, fault
        self.on_batch_end = on_batch_end
        self.epoch = self.global_step = self.batches_done = self.resumed_from = self.steps_per_epoch = 0
        self.first_step_s: float | None = None
        self.first_step_unix: float | None = None
        self.checkpoints: CheckpointManager | None = None
        self.control = Control(world_size)  # the worker installed the preemption signals' handlers
        #: The judge the chief asks at each epoch's end (a tuning study's pruner), when there is one.
        self.gate = EpochGate.from_env() if self.is_chief else None
        self.progress: Any = None
        self._prepared = False
        #: The run ended before its batches ran out: the function left its loop, or it resumed from such an end.
        self.ended = False
        #: Batches are being handed out (set while ``run`` is under way; cleared at its end or the function's leaving).
        self._running = False
        #: Where the function left its loop: whether it stepped in the batch it had (None: it has not left).
        self._left_stepped: bool | None = None
        self._handed: Callable[[], Any] = lambda: None  # the batches' iterator, while the function holds it
        self.history_file = HistoryFile(out / EPOCH_METRICS_FILE)

    # --- resuming -------------------------------------------------------------------------------

    def resume(self, io: StateIO) -> int:
        """Checkpoint the state ``io`` holds from now on (in ``checkpoint_dir``, by default the
        output's ``checkpoints``), and continue from the newest readable checkpoint.

        Returns:
            The global step it resumed from (0 on a fresh start).

        Raises:
            TrainpipeError: the ranks loaded different checkpoints.
        """
        s = self.settings
        folder = s.checkpoint_folder
        every_steps, every_s = s.checkpoint_every_steps, s.checkpoint_every_s
        checkpoints = CheckpointManager(folder, s.keep_checkpoints, every_steps, every_s, io, chief=self.is_chief)
        self.checkpoints = checkpoints
        checkpoints.remove_stale()
        self.barrier()
        trainer = checkpoints.load_newest()
        if trainer is not None:
            self.global_step = self.resumed_from = int(trainer["global_step"])
            self.batches_done = int(trainer["batches_done"])
            self.metrics.carried = {k: list(v) for k, v in trainer.get("carried", {}).items()}
            self.metrics.history = list(trainer.get("history", []))
            self.ended = bool(trainer.get("ended", False))  # the function ended the run there (early stopping)
            self.history_file.restart()  # the file is rewritten from the checkpoint's history
        # every rank must resume from the same step: a rank that read another folder would diverge
        s1, s2 = self.all_reduce_sum([float(self.global_step), float(self.global_step) ** 2])
        if s1 * s1 != self.world_size * s2:
            raise TrainpipeError(
                "checkpoint: ranks loaded different checkpoints; is checkpoint_dir shared by every node?"
            )
        return self.global_step

    def barrier(self) -> None:
        self.all_reduce_sum([0.0])

    def wait_for_checkpoints(self) -> None:
        """Wait until the checkpoint being written in the background is on disk."""
        if self.checkpoints is not None:
            self.checkpoints.wait()

    # --- the loop -------------------------------------------------------------------------------

    def batches(self, source: Any, placement: sources.Placement) -> Iterator[Any]:
        """:meth:`run`'s iterator, followed (weakly) so that :meth:`leave` can close one the function kept."""
        import weakref

        it = self.run(source, placement)
        self._handed = weakref.ref(it)
        return it

    def run(self, source: Any, placement: sources.Placement) -> Iterator[Any]:
        """Every batch of ``source`` from where the run stands, epoch after epoch, this rank's share
        placed by ``placement``; the work between batches (epoch ends, checkpoints, control points)
        happens inside the iteration.

        Raises:
            InputError: the source has fewer rows than one global batch.
            Preempted: the platform asked the job to stop (a checkpoint was written first).
        """
        from trainpipe.contract.progress import Progress

        s = self.settings
        per_epoch, iterate = sources.plan(source, placement, s, self.rank, self.world_size)
        if per_epoch < 1:
            raise InputError(f"batch_size: {s.batch_size} is larger than the rows the training data gives each epoch")
        self.steps_per_epoch = per_epoch
        self._local_batch, self._last_epoch = s.batch_size // self.world_size, s.epochs - 1
        self.progress = Progress(
            "train_model",
            self.planned_batches(),
            "batches",
            start=self.batches_done,
            rate_unit=("samples", float(s.batch_size)),
            show=self.is_chief,
        )
        self.timer.begin()
        if self.checkpoints is not None:
            self.checkpoints.start_clock()
        self.act(self.agree())  # a stop asked for during start-up ends here
        start_epoch, skip = divmod(self.batches_done, per_epoch)
        self._running = True
        for epoch in range(start_epoch, s.epochs if not self.ended else start_epoch):
            if self.done():
                break
            self.epoch = epoch
            it = iterate(epoch, skip if epoch == start_epoch else 0)
            while not self.done():
                self.timer.batch_start()
                batch = next(it, None)
                if batch is None:
                    break
                if self.fault.kind:  # fault injection (tests): nothing to ask on a real run's every batch
                    self.fault.maybe_kill("kill", self.rank, self.global_step, before=self.wait_for_checkpoints)
                    self.fault.maybe_preempt(self.global_step)
                step_before = self.global_step
                self.timer.mark("ready")
                try:
                    yield batch
                except GeneratorExit:  # the function left its loop (or raised): see leave()
                    self._left_in(step_before)
                    raise
                self.timer.mark("back")
                self.after_batch(step_before)
        self._running = False
        self._wind_up()

    def _wind_up(self) -> None:
        self.write_history()  # a retry that resumed at the last step ends no epoch: its history is the checkpoint's
        self.wait_for_checkpoints()
        self.timer.drain(wait=True)
        self.progress.finish()

    def _left_in(self, step_before: int) -> None:
        """The function stopped asking for batches in this one: a ``break`` or a ``return`` (or an exception).
        Only what is this rank's own happens here (the batch's record, when it stepped: the batch
        counts), since an exception unwinding through the loop closes the iterator the same way;
        the end of the run, which takes every rank, waits for :meth:`leave` after the function returned."""
        if not self._running:
            return
        self._running = False
        stepped = self.global_step > step_before
        self._left_stepped = stepped
        if stepped:
            self.batches_done += 1
            self.progress.update(self.batches_done)
            with contextlib.suppress(Exception):  # unwinding a device error: the run's own error is the one to report
                self.timer.mark("back")
                self.timer.finish_batch(self.epoch, self.global_step, self._local_batch)

    def leave(self) -> None:
        """After the function returned: if it left its loop while batches remained (early stopping),
        the run ends where it left (every rank together, as at the last batch): the partial epoch's
        line in ``metrics.jsonl``, a final checkpoint (a rerun resumes to this end, not past it),
        and a stop if the platform asked for one.

        Raises:
            Preempted: the ranks agreed the platform asked the job to stop (the checkpoint was written first).
        """
        it = self._handed()
        if it is not None:
            it.close()  # an iterator the function kept: it left the loop all the same
        stepped, self._left_stepped = self._left_stepped, None
        if stepped is None:
            return
        self.ended = True
        # the batch it stepped in had its epoch's end to come; one it left unstepped ends the epoch under way, if any
        unended = stepped or self.batches_done % self.steps_per_epoch != 0
        self._between(BatchEnd(stepped, unended, last=True, control_point=False, left=True), steps_due=False)
        self._wind_up()

    def after_batch(self, step_before: int) -> None:
        """A batch's record, then the work between batches that :func:`due_now` and :func:`due_after` decide."""
        self.batches_done += 1
        stepped = self.global_step > step_before
        self.progress.update(self.batches_done)
        self.timer.finish_batch(self.epoch, self.global_step, self._local_batch)
        # after the record: the profiler's own work at a window's edge goes to the next batch,
        # outside the window it traced, whose steps it would otherwise lengthen
        self.on_batch_end()
        ckpt = self.checkpoints
        if stepped and not self._prepared and ckpt is not None:
            ckpt.io.prepare()  # the staging buffers, once the optimizer's state exists
            self._prepared = True
        ends_epoch = self.batches_done % self.steps_per_epoch == 0 or self.done()
        control_point = self.control.due(self.batches_done)
        if not (ends_epoch or control_point or (stepped and ckpt is not None and ckpt.every_steps)):
            return  # the common batch: due_now says nothing is due, and it allocates nothing to say so
        end = BatchEnd(
            stepped, ends_epoch, self.done() or (ends_epoch and self.epoch == self._last_epoch), control_point
        )
        self._between(end, stepped and ckpt is not None and ckpt.steps_due(self.global_step))

    def _between(self, end: BatchEnd, steps_due: bool) -> None:
        """The work :func:`due_now` and :func:`due_after` decide after a batch, in their order."""
        now = due_now(end)
        if now.end_epoch:
            self.end_epoch()
        agreed = self.agree() if now.agree else None
        due = due_after(end, agreed, steps_due)
        saved = self.save_checkpoint(mid_epoch=due.mid_epoch, final=due.final) if due.checkpoint else False
        if (now.end_epoch or saved or agreed is not None) and not end.left:
            self.timer.extend_last()  # what the loop did after the batch (metrics, agreement, staging) is the batch's
        if due.stop is not None:
            self.stop(due.stop)

    def agree(self) -> Decision:
        ckpt = self.checkpoints
        return self.control.agree(self.batches_done, ckpt is not None and ckpt.time_due(), self.all_reduce_sum)

    def act(self, decision: Decision) -> None:
        """Stop when the ranks agreed the platform asked to (before the first batch)."""
        if decision.preempt is not None:
            self.stop(decision.preempt)

    def stop(self, signal_name: str) -> None:
        """Stop on the signal the ranks agreed on, once the checkpoint of this step is written."""
        self.wait_for_checkpoints()
        self.barrier()  # no rank leaves before the chief has renamed the checkpoint into place
        raise preempted(signal_name, self.global_step, self.checkpoints)

    def save_checkpoint(self, mid_epoch: bool, final: bool = False) -> bool:
        """Checkpoint this step (every rank at once); False when it is the one already written (a final
        one is written again: the one of this step does not say the run ended there)."""
        ckpt = self.checkpoints
        if ckpt is None or (ckpt.last_step == self.global_step and not final):
            return False
        if mid_epoch:
            self.metrics.carry()  # the partial sums travel with the checkpoint
        # a copy, not the live lists: trainer.json is written by the background writer, after the loop went on (an
        # epoch's end meanwhile appended its line to the history and added to the carried sums, which a resume from
        # this step then counted twice)
        trainer = {
            "global_step": self.global_step,
            "batches_done": self.batches_done,
            "epoch": self.epoch,
            "carried": {k: list(v) for k, v in self.metrics.carried.items()},
            "history": [dict(line) for line in self.metrics.history],
            "world_size": self.world_size,
            "ended": final or self.ended,
        }
        ckpt.save(self.global_step, trainer)
        return True

    def write_history(self) -> None:
        """The epochs' lines so far (``metrics.jsonl``), written by the chief (:class:`HistoryFile`)."""
        if self.is_chief:
            self.history_file.write(self.metrics.history)

    def end_epoch(self) -> None:
        line = self.metrics.end_epoch(self.epoch, self.global_step)
        self.write_history()
        if self.is_chief:
            shown = " ".join(f"{k} {v:.4f}" for k, v in line.items() if k not in ("epoch", "step"))
            head = f"train_model: epoch {self.epoch + 1}/{self.settings.epochs} step {self.global_step}"
            left = " (the function left its loop: the run ends here)" if self.ended else ""
            print(f"{head} {shown}".rstrip() + left, file=sys.stderr, flush=True)
        if self.gate is not None and not self.ended and self.gate.ask(line):  # agreed at this epoch end's control point
            control_points.request(signal.SIGTERM)

    def done(self) -> bool:
        return self.settings.max_steps is not None and self.global_step >= self.settings.max_steps

    def count_step(self, t0: float) -> None:
        """One optimizer step taken (``t0``: when the rank started, for the time to the first step)."""
        self.global_step += 1
        if self.first_step_s is None:
            self.first_step_s, self.first_step_unix = time.perf_counter() - t0, time.time()

    def planned_batches(self) -> int:
        if self.ended:
            return self.batches_done
        planned = self.steps_per_epoch * self.settings.epochs
        return min(planned, self.settings.max_steps) if self.settings.max_steps else planned

    def record(self, dist_name: str, t0: float) -> dict[str, Any]:
        """This rank's telemetry record: who it is, where the run got to, what its steps and
        checkpoints took, what it used (``t0``: when the rank started)."""
        import resource

        from trainpipe.contract.resources import usable_cpus

        self.timer.drain(wait=True)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        s = self.settings
        local_world = os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("HOROVOD_LOCAL_SIZE", self.world_size))
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "backend": s.backend,
            "dist_backend": dist_name,
            "precision": s.precision,
            "batch_size": s.batch_size,
            "wall_s": time.perf_counter() - t0,
            "time_to_first_step_s": self.first_step_s,
            "resumed_from_step": self.resumed_from,
            "global_steps": self.global_step,
            "first_step_unix": self.first_step_unix,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "usable_cpus": usable_cpus(),
            "peak_rss_mb": usage.ru_maxrss / 1024.0,
            "local_world": int(local_world),
            "checkpoints": self.checkpoints.figures() if self.checkpoints is not None else None,
            "steps": self.timer.records,
        }
