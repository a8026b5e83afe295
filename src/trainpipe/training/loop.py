"""The one training driver: what every backend's context shares, framework-free.

A training function owns its loop; the context owns what surrounds it: how many batches an
epoch has and where a resumed run picks up, the epoch metrics (``ctx.log`` values, reduced over
ranks at each epoch end), when a checkpoint is taken (between batches, after the step's ``log``
calls, so a resumed run reproduces the metrics too), what happens when the platform asks the job
to stop, the per-step telemetry profile_training reads, and fault injection for tests.

The parts live beside it, each with one job: :mod:`~trainpipe.training.checkpoint` (resuming,
cadence, staging, the background writer), :mod:`~trainpipe.training.control` (the ranks'
agreement on preemption and on the checkpoint interval), :mod:`~trainpipe.training.timing` (step
records), :mod:`~trainpipe.training.metrics` (the epoch means) and
:mod:`~trainpipe.training.sources` (batches). A backend's context supplies the framework parts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainpipe.contract.errors import InputError, Preempted, TrainpipeError
from trainpipe.contract.io import atomic_write_json, atomic_write_text
from trainpipe.training import sources
from trainpipe.training.checkpoint import CHECKPOINT_DIR, CheckpointManager, StateIO, checkpoint_name
from trainpipe.training.control import Control, Decision
from trainpipe.training.faults import Fault, attempt
from trainpipe.training.metrics import EpochMetrics
from trainpipe.training.timing import StepTimer

METRICS_FILE = "metrics.jsonl"
TELEMETRY_DIR = "telemetry"


class BaseContext:
    """What a training function's ``ctx`` does whatever the framework.

    Attributes:
        rank, world_size, local_rank: This process's place in the job.
        is_chief: ``rank == 0``.
        epoch: The epoch the current batch belongs to.
        global_step: Optimizer steps taken (``ctx.step`` calls), resumed ones included.
        settings: train_model's settings (epochs, batch_size, precision, seed, ...).
        data: The snapshot train_model was given (:class:`~trainpipe.training.data.Snapshot`).
    """

    framework = ""

    def __init__(self, settings: Any, rank: int, world_size: int, local_rank: int, dist_name: str) -> None:
        from trainpipe.training.data import Snapshot

        self.settings = settings
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.is_chief = rank == 0
        self.dist_name = dist_name
        self.out = Path(settings.output_dir)
        self.ckpt_dir = Path(settings.checkpoint_dir) if settings.checkpoint_dir else self.out / CHECKPOINT_DIR
        self.fault = Fault.from_env()
        self.data = Snapshot(
            settings.data,
            settings.label_column,
            settings.task,
            settings.test_fraction,
            settings.seed,
            settings.batch_size,
        )
        self.epoch = self.global_step = self.batches_done = self.resumed_from = self.steps_per_epoch = 0
        self.restarts = attempt()
        self.metrics = EpochMetrics(world_size, self._keep, self._fold, self._to_float, self._all_reduce_sum)
        self.checkpoints: CheckpointManager | None = None  # made by restore()
        self._control = Control(world_size)  # the worker installed the preemption signals' handlers
        self._t0 = time.perf_counter()
        self.timer = self._timer()
        self.first_step_s: float | None = None
        self.first_step_unix: float | None = None
        self._tabular: Any = None  # trainpipe's own data source, when batches() was given one (its classes, an example)
        self._batches_started = self._model_saved = self._prepared = False
        self._progress: Any = None

    # --- what a backend supplies ----------------------------------------------------------------

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        """Host numbers summed over every rank: a collective that never waits for a device."""
        raise NotImplementedError

    def _keep(self, value: Any) -> Any:
        return value

    def _fold(self, values: list[Any]) -> Any:
        """The sum of logged values where they live (a host float here)."""
        return float(sum(float(v) for v in values))

    def _to_float(self, value: Any) -> float:
        return float(value)

    def _placement(self) -> sources.Placement:
        raise NotImplementedError

    def _timer(self) -> StepTimer:
        return StepTimer(self.framework, self._t0)

    def _state_io(self, objects: dict[str, Any]) -> StateIO:
        """The backend's reading and writing of the registered objects (refuses what it cannot hold)."""
        raise NotImplementedError

    def _on_batch_end(self) -> None:
        """After each batch's bookkeeping (the profiler's step)."""

    def peer_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a collective that failed because a peer died or hung (restartable)."""
        return False

    # --- state ----------------------------------------------------------------------------------

    def restore(self, **objects: Any) -> int:
        """Register what a checkpoint holds and load the newest checkpoint into it.

        Call once, after the model is prepared and the optimizer made, before :meth:`batches`.
        Every object is restored in place: modules, optimizers, schedulers, anything with
        ``state_dict``/``load_state_dict``. With it the run checkpoints every ``checkpoint_every_s``
        seconds (and every ``checkpoint_every_steps`` steps when set), at its last step, and when the
        platform asks it to stop; a rerun or a restarted group continues exactly where it stopped.

        Returns:
            The global step it resumed from (0 on a fresh start).

        Raises:
            InputError: called twice, after :meth:`batches`, or with an object that has no state.
        """
        if self.checkpoints is not None:
            raise InputError("train_function: ctx.restore was called twice; register every object in one call")
        if self._batches_started:
            raise InputError(
                "train_function: ctx.restore must come before ctx.batches (it sets where the data resumes)"
            )
        if not objects:
            raise InputError(
                "train_function: ctx.restore needs the objects to checkpoint, e.g. ctx.restore(model=model, optimizer=opt)"
            )
        s = self.settings
        manager = CheckpointManager(
            self.ckpt_dir,
            s.keep_checkpoints,
            s.checkpoint_every_steps,
            s.checkpoint_every_s,
            self._state_io(dict(objects)),
            chief=self.is_chief,
        )
        self.checkpoints = manager
        manager.remove_stale()
        self._barrier()
        trainer = manager.load_newest()
        if trainer is not None:
            self.global_step = self.resumed_from = int(trainer["global_step"])
            self.batches_done = int(trainer["batches_done"])
            self.metrics.carried = {k: list(v) for k, v in trainer.get("carried", {}).items()}
            self.metrics.history = list(trainer.get("history", []))
        # every rank must resume from the same step: a rank that read another folder would diverge
        s1, s2 = self._all_reduce_sum([float(self.global_step), float(self.global_step) ** 2])
        if s1 * s1 != self.world_size * s2:
            raise TrainpipeError(
                "checkpoint: ranks loaded different checkpoints; is checkpoint_dir shared by every node?"
            )
        return self.global_step

    def _barrier(self) -> None:
        self._all_reduce_sum([0.0])

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "batches_done": self.batches_done,
            "epoch": self.epoch,
            "carried": self.metrics.carried,
            "history": self.metrics.history,
            "world_size": self.world_size,
        }

    def _save_checkpoint(self, mid_epoch: bool) -> bool:
        """Checkpoint this step (every rank at once); False when it is the one already written."""
        ckpt = self.checkpoints
        if ckpt is None or ckpt.last_step == self.global_step:
            return False
        if mid_epoch:
            self.metrics.carry()  # the partial sums travel with the checkpoint
        ckpt.save(self.global_step, self._trainer_state())
        return True

    def wait_for_checkpoints(self) -> None:
        """Wait until the checkpoint being written in the background is on disk."""
        if self.checkpoints is not None:
            self.checkpoints.wait()

    @property
    def last_checkpoint_unix(self) -> float | None:
        """When the newest checkpoint of this run was started (live telemetry)."""
        return self.checkpoints.last_unix if self.checkpoints is not None else None

    # --- data and the loop --------------------------------------------------------------------------

    @property
    def local_batch_size(self) -> int:
        return self.settings.batch_size // self.world_size

    @property
    def step_records(self) -> list[dict[str, Any]]:
        """One record per batch this process ran (what profile_training and live telemetry read)."""
        return self.timer.records

    def batches(self, source: Any) -> Iterator[Any]:
        """Every batch of the run, epoch after epoch, this rank's share, on this rank's device.

        A source is trainpipe's :class:`~trainpipe.training.data.TabularData` (yields ``(x, y)``),
        a :class:`~trainpipe.training.data.ParquetStream`, a tuple or dict of arrays or tensors
        of equal length (yields the same shape), a map-style dataset, or any
        :class:`~trainpipe.training.data.StreamSource`. The global batch is ``batch_size``; each
        rank gets ``batch_size / world_size`` rows. The order is seeded by ``seed`` and the epoch;
        a resumed run starts at the batch after its checkpoint. Epoch ends (metrics), checkpoints
        and preemption happen inside the iteration. Call it once per run.

        Raises:
            InputError: called twice, or the source has fewer rows than one global batch.
            Preempted: the platform asked the job to stop (a checkpoint was written first).
        """
        if self._batches_started:
            raise InputError(
                "train_function: ctx.batches was called twice; iterate one call over the whole run (it spans every epoch)"
            )
        self._batches_started = True
        if self.checkpoints is None and self.is_chief:
            print(
                "train_model: warning: the training function registered no state with ctx.restore: "
                "this run neither checkpoints nor resumes",
                file=sys.stderr,
            )
        s = self.settings
        if sources.is_trainpipe_rows(source):
            self._tabular = source
        per_epoch, iterate = sources.plan(source, self._placement(), s, self.rank, self.world_size)
        if per_epoch < 1:
            raise InputError(f"batch_size: {s.batch_size} is larger than the rows the training data gives each epoch")
        self.steps_per_epoch = per_epoch
        from trainpipe.telemetry import Progress

        self._progress = Progress(
            "train_model",
            self._planned_batches(),
            "batches",
            start=self.batches_done,
            rate_unit=("samples", float(s.batch_size)),
            show=self.is_chief,
        )
        self.timer.begin()
        if self.checkpoints is not None:
            self.checkpoints.start_clock()
        self._act(self._agree())  # a stop asked for during start-up ends here
        start_epoch, skip = divmod(self.batches_done, per_epoch)
        for epoch in range(start_epoch, s.epochs):
            if self._done():
                break
            self.epoch = epoch
            it = iterate(epoch, skip if epoch == start_epoch else 0)
            while not self._done():
                self.timer.batch_start()
                batch = next(it, None)
                if batch is None:
                    break
                self.fault.maybe_kill("kill", self.rank, self.global_step, before=self.wait_for_checkpoints)
                step_before = self.global_step
                self.timer.mark("ready")
                yield batch
                self.timer.mark("back")
                self._after_batch(step_before)
        self.wait_for_checkpoints()
        self.timer.drain(wait=True)
        self._progress.finish()

    def _after_batch(self, step_before: int) -> None:
        """A batch's bookkeeping; at an epoch end, a control point or a due step, more."""
        self.batches_done += 1
        s, stepped = self.settings, self.global_step > step_before
        ends_epoch = self.batches_done % self.steps_per_epoch == 0 or self._done()
        last = self._done() or (ends_epoch and self.epoch == s.epochs - 1)
        self._progress.update(self.batches_done)
        self.timer.finish_batch(self.epoch, self.global_step, self.local_batch_size)
        # after the record: the profiler's own work at a window's edge goes to the next batch,
        # outside the window it traced, whose steps it would otherwise lengthen
        self._on_batch_end()
        if stepped and not self._prepared and self.checkpoints is not None:
            self.checkpoints.io.prepare()  # the staging buffers, once the optimizer's state exists
            self._prepared = True
        if ends_epoch:
            self._end_epoch()
        decision = self._agree() if ends_epoch or self._control.due(self.batches_done) else None
        due = (
            last
            or (decision is not None and decision.time_due)
            or (stepped and self.checkpoints is not None and self.checkpoints.steps_due(self.global_step))
        )
        saved = self._save_checkpoint(mid_epoch=not ends_epoch) if due or (decision and decision.preempt) else False
        if ends_epoch or saved or decision is not None:
            self.timer.extend_last()  # what the loop did after the batch (metrics, agreement, staging) is the batch's
        if decision is not None:
            self._act(decision)

    def _agree(self) -> Decision:
        ckpt = self.checkpoints
        return self._control.agree(self.batches_done, ckpt is not None and ckpt.time_due(), self._all_reduce_sum)

    def _act(self, decision: Decision) -> None:
        """Stop when the ranks agreed the platform asked to, once the checkpoint of this step is written."""
        if decision.preempt is None:
            return
        self.wait_for_checkpoints()
        self._barrier()  # no rank leaves before the chief has renamed the checkpoint into place
        ckpt = self.checkpoints
        if ckpt is None:
            kept = "the training function registered no state with ctx.restore, so a retry starts over"
        elif ckpt.last_step is None:
            kept = "nothing was trained yet, so a retry starts over"
        else:
            kept = f"a retry resumes from {checkpoint_name(ckpt.last_step)}"
        raise Preempted(f"preempted by {decision.preempt} at step {self.global_step}: {kept}")

    def _end_epoch(self) -> None:
        line = self.metrics.end_epoch(self.epoch, self.global_step)
        if self.is_chief:
            atomic_write_text(
                self.out / METRICS_FILE, "".join(json.dumps(h, sort_keys=True) + "\n" for h in self.metrics.history)
            )
            shown = " ".join(f"{k} {v:.4f}" for k, v in line.items() if k not in ("epoch", "step"))
            print(
                f"train_model: epoch {self.epoch + 1}/{self.settings.epochs} step {self.global_step} {shown}".rstrip(),
                file=sys.stderr,
                flush=True,
            )

    def _done(self) -> bool:
        return self.settings.max_steps is not None and self.global_step >= self.settings.max_steps

    def _count_step(self) -> None:
        """One optimizer step taken (a backend's ``step`` calls this last)."""
        self.global_step += 1
        if self.first_step_s is None:
            self.first_step_s, self.first_step_unix = time.perf_counter() - self._t0, time.time()

    # --- metrics --------------------------------------------------------------------------------

    def log(self, **values: Any) -> None:
        """Record this step's values (the loss, an accuracy; tensors are fine: no device sync).

        Each epoch's line in ``metrics.jsonl`` (and the MLflow run) holds every key's mean over
        the epoch's steps and every rank. Every rank must log the same keys.
        """
        self.metrics.log(values)

    # --- the model ------------------------------------------------------------------------------

    def save_model(
        self,
        model: Any,
        *,
        input_example: Any = None,
        init_args: dict[str, Any] | None = None,
        builder: Any = None,
        classes: list[Any] | None = None,
        task: str | None = None,
    ) -> None:
        """Write the trained model: ``model.safetensors`` (weights only) and ``model.json`` (how to
        rebuild it), which train_model turns into an MLflow pyfunc model that loads without trainpipe.

        Call it on every rank (FSDP gathers the shards); rank 0 writes. The model is rebuilt for
        serving as ``builder(**init_args)``: by default its own class, so ``MyNet(**init_args)``.
        That class must be importable from a package (not ``__main__``, not a local class): the
        package travels with the model. The served model takes a DataFrame with the columns of
        ``input_example`` (raw values: scaling belongs inside the model) and its output is logits
        (classification, one per class in ``classes``) or values (regression).

        Args:
            model: The trained model (as ``prepare`` returned it, or the module inside).
            input_example: A few rows of raw features (a DataFrame); default: from ``ctx.data``.
            init_args: Keyword arguments that rebuild the model (JSON-able).
            builder: What rebuilds it, a callable or ``"package.module:Name"`` (default: its class;
                required with TensorFlow, a function returning the Keras model).
            classes: The label of each output (classification; default: the data's classes).
            task: ``classification`` or ``regression`` (default: the settings').

        Raises:
            InputError: it cannot be rebuilt from what is given, its code cannot travel, or it
                fails on the example.
        """
        self._save_model(model, input_example, init_args, builder, classes, task or self.settings.task)
        self._model_saved = True

    def _save_model(
        self,
        model: Any,
        input_example: Any,
        init_args: dict[str, Any] | None,
        builder: Any,
        classes: list[Any] | None,
        task: str,
    ) -> None:
        raise NotImplementedError

    # --- what live telemetry reads ----------------------------------------------------------------

    def _planned_batches(self) -> int:
        planned = self.steps_per_epoch * self.settings.epochs
        return min(planned, self.settings.max_steps) if self.settings.max_steps else planned

    def progress_ratio(self) -> float | None:
        """The share of the run's batches done (None before :meth:`batches` knows how many)."""
        planned = self._planned_batches()
        return min(self.batches_done / planned, 1.0) if planned else None

    def eta_seconds(self) -> float | None:
        """Seconds left at this process's rate (None before it has one)."""
        return self._progress.eta() if self._progress is not None else None

    def learning_rate(self) -> float | None:
        """The optimizer's current learning rate, where the backend knows the optimizer."""
        return None

    def last_logged(self) -> dict[str, float]:
        """The newest value of each key logged with :meth:`log`, as numbers."""
        return self.metrics.last_logged()

    def device_figures(self) -> dict[str, Any]:
        """Accelerator figures: ``peak_memory_bytes`` and per-GPU NVML readings (none on CPU)."""
        return {}

    # --- the end ----------------------------------------------------------------------------------

    def finish(self) -> None:
        """After the training function returned: its checkpoints written, a step taken and a model
        saved (else one line), this rank's telemetry written, and no rank gone before rank 0 has
        written the model (across nodes, the node that reports it may not be the one that wrote it).

        Raises:
            InputError: the function never stepped or never saved its model.
        """
        self.wait_for_checkpoints()
        spec = self.settings.train_function
        if self.global_step == 0:
            raise InputError(f"train_function: {spec} returned without calling ctx.step: nothing was trained")
        if not self._model_saved:
            raise InputError(
                f"train_function: {spec} returned without calling ctx.save_model: there is no model to register"
            )
        self.write_telemetry()
        self._last_barrier()

    def _last_barrier(self) -> None:
        self._barrier()

    def telemetry(self) -> dict[str, Any]:
        """This rank's telemetry (profile_training reads it); a backend adds its own fields."""
        import resource

        from trainpipe.resources import usable_cpus

        self.timer.drain(wait=True)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        s = self.settings
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "backend": s.backend,
            "dist_backend": self.dist_name,
            "precision": s.precision,
            "batch_size": s.batch_size,
            "wall_s": time.perf_counter() - self._t0,
            "time_to_first_step_s": self.first_step_s,
            "resumed_from_step": self.resumed_from,
            "global_steps": self.global_step,
            "first_step_unix": self.first_step_unix,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "usable_cpus": usable_cpus(),
            "peak_rss_mb": usage.ru_maxrss / 1024.0,
            "local_world": int(
                os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("HOROVOD_LOCAL_SIZE", self.world_size))
            ),
            "checkpoints": self.checkpoints.figures() if self.checkpoints is not None else None,
            "steps": self.step_records,
        }

    def write_telemetry(self) -> None:
        """This rank's telemetry file; a rerun that found its training already finished (nothing
        left to step through) keeps the steps the run that did the training recorded."""
        path = self.out / TELEMETRY_DIR / f"rank{self.rank}.json"
        record = self.telemetry()
        if not record["steps"] and path.exists():
            return
        atomic_write_json(path, record)

    def close(self) -> None:
        """Release what the backend holds (a write in flight is waited for: a failing run reports its own error)."""
        if self.checkpoints is not None:
            try:
                self.checkpoints.wait()
            except BaseException:  # noqa: BLE001,S110 (the run's own error is the one to report)
                pass
