"""The training context a training function calls (``ctx``), whatever the framework.

A training function owns its loop; the context owns what surrounds it through a small public
API: :meth:`BaseContext.restore` (what a checkpoint holds), :meth:`BaseContext.batches` (this
rank's batches, resumable), :meth:`BaseContext.log`, :meth:`BaseContext.save_model`, and what
live telemetry and profile_training read. The work between batches (epoch ends, checkpoints,
preemption, control points) is the driver's (:mod:`~trainpipe.training.loop`). A backend's
context (:mod:`~trainpipe.training.torch.context`, :mod:`~trainpipe.training.tf.context`)
supplies the framework parts.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json
from trainpipe.contract.layout import TELEMETRY_DIR
from trainpipe.training import sources
from trainpipe.training.checkpoint import StateIO
from trainpipe.training.data import Snapshot
from trainpipe.training.faults import Fault, attempt
from trainpipe.training.loop import Loop
from trainpipe.training.metrics import EpochMetrics, HostValues
from trainpipe.training.timing import StepTimer

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig


def _from_loop(name: str, doc: str) -> Any:
    """A read-only attribute of the context that is the loop's."""
    return property(lambda self: getattr(self.loop, name), doc=doc)


class BaseContext:
    """What a training function's ``ctx`` does whatever the framework.

    Attributes:
        rank, world_size, local_rank: This process's place in the job.
        is_chief: ``rank == 0``.
        epoch: The epoch the current batch belongs to.
        global_step: Optimizer steps taken (``ctx.step`` calls), resumed ones included.
        settings: train_model's settings (epochs, batch_size, precision, seed, ...).
        data: The snapshot train_model was given (:class:`~trainpipe.training.data.Snapshot`).
        metrics: The epoch means of what :meth:`log` recorded.
        checkpoints: The run's checkpoint manager, once :meth:`restore` made it.
        loop: The driver of the loop (position, checkpoints due, control points).
    """

    framework = ""

    def __init__(self, settings: TrainModelConfig, rank: int, world_size: int, local_rank: int, dist_name: str) -> None:
        self.settings = settings
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.is_chief = rank == 0
        self.dist_name = dist_name
        self.out = Path(settings.output_dir)
        s = settings
        self.data = Snapshot(s.data, s.label_column, s.task, s.test_fraction, s.seed, s.batch_size)
        self.restarts = attempt()
        self.metrics = EpochMetrics(world_size, self._logged_values(), self._all_reduce_sum)
        self._t0 = time.perf_counter()
        self.timer = self._timer()
        self.loop = Loop(
            settings,
            rank,
            world_size,
            self.out,
            self.timer,
            self.metrics,
            self._all_reduce_sum,
            Fault.from_env(),
            self._on_batch_end,
        )
        self._tabular: Any = None  # trainpipe's own data source, when batches() was given one (its classes, an example)
        self._batches_started = self._model_saved = False

    # --- what a backend supplies ----------------------------------------------------------------

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        """Host numbers summed over every rank: a collective that never waits for a device."""
        raise NotImplementedError

    def _logged_values(self) -> HostValues:
        """How logged values are kept and summed (host numbers here; tensors where they live in a backend)."""
        return HostValues()

    def _placement(self) -> sources.Placement:
        raise NotImplementedError

    def _timer(self) -> StepTimer:
        return StepTimer(self.framework, self._t0)

    def _state_io(self, objects: dict[str, Any]) -> StateIO:
        """The backend's reading and writing of the registered objects (refuses what it cannot hold)."""
        raise NotImplementedError

    def _on_batch_end(self) -> None:
        """After each batch's record (the profiler's step)."""

    def peer_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a collective that failed because a peer died or hung (restartable)."""
        return False

    # --- where the run is (the loop's) ----------------------------------------------------------

    epoch = _from_loop("epoch", "The epoch the current batch belongs to.")
    global_step = _from_loop("global_step", "Optimizer steps taken (``ctx.step`` calls), resumed ones included.")
    batches_done = _from_loop("batches_done", "Batches this run has gone through, resumed ones included.")
    steps_per_epoch = _from_loop("steps_per_epoch", "Batches an epoch has on this rank (known once batches() started).")
    resumed_from = _from_loop("resumed_from", "The global step the run resumed from (0 on a fresh start).")
    checkpoints = _from_loop("checkpoints", "The run's checkpoint manager, once :meth:`restore` made it.")
    fault = _from_loop("fault", "Fault injection for tests (``TRAINPIPE_FAULT``).")

    @property
    def local_batch_size(self) -> int:
        return self.settings.batch_size // self.world_size

    @property
    def step_records(self) -> list[dict[str, Any]]:
        """One record per batch this process ran (what profile_training and live telemetry read)."""
        return self.timer.records

    @property
    def last_checkpoint_unix(self) -> float | None:
        """When the newest checkpoint of this run was started (live telemetry)."""
        return self.checkpoints.last_unix if self.checkpoints is not None else None

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
                "train_function: ctx.restore needs the objects to checkpoint, "
                "e.g. ctx.restore(model=model, optimizer=opt)"
            )
        return self.loop.resume(self._state_io(dict(objects)))

    def wait_for_checkpoints(self) -> None:
        """Wait until the checkpoint being written in the background is on disk."""
        self.loop.wait_for_checkpoints()

    def _barrier(self) -> None:
        self.loop.barrier()

    # --- data -------------------------------------------------------------------------------------

    def batches(self, source: Any) -> Iterator[Any]:
        """Every batch of the run, epoch after epoch, this rank's share, on this rank's device.

        A source is trainpipe's :class:`~trainpipe.training.data.TabularData` (yields ``(x, y)``),
        a :class:`~trainpipe.training.data.ParquetStream`, a tuple or dict of arrays or tensors
        of equal length (yields the same shape), a map-style dataset, or any
        :class:`~trainpipe.training.data.StreamSource`. The global batch is ``batch_size``; each
        rank gets ``batch_size / world_size`` rows. The order is seeded by ``seed`` and the epoch;
        a resumed run starts at the batch after its checkpoint. Epoch ends (metrics), checkpoints
        and preemption happen inside the iteration. Call it once per run.

        Leaving the loop early (``break``, ``return``: early stopping) ends the run there once the
        function returns (:meth:`finish`): the partial epoch's line, a checkpoint marked as the run's
        end (a resume is handed no batch). Every rank must leave at the same batch: decide on what every
        rank has (``ctx.metrics.history``, a value averaged with ``all_reduce``).

        Raises:
            InputError: called twice, or the source has fewer rows than one global batch.
            Preempted: the platform asked the job to stop (a checkpoint was written first).
        """
        if self._batches_started:
            raise InputError(
                "train_function: ctx.batches was called twice; iterate one call over the whole run "
                "(it spans every epoch)"
            )
        self._batches_started = True
        if self.checkpoints is None and self.is_chief:
            print(
                "train_model: warning: the training function registered no state with ctx.restore: "
                "this run neither checkpoints nor resumes",
                file=sys.stderr,
            )
        if sources.is_trainpipe_rows(source):
            self._tabular = source
        yield from self.loop.batches(source, self._placement())

    def _count_step(self) -> None:
        """One optimizer step taken (a backend's ``step`` calls this last)."""
        self.loop.count_step(self._t0)

    # --- metrics and the model ------------------------------------------------------------------

    def log(self, **values: Any) -> None:
        """Record this step's values (the loss, an accuracy; tensors are fine: no device sync).

        Each epoch's line in ``metrics.jsonl`` (and the MLflow run) holds every key's mean over
        the epoch's steps and every rank. Every rank must log the same keys.
        """
        self.metrics.log(values)

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

    def _source_rows(self) -> Any:
        """trainpipe's rows the function trained on: the source it gave :meth:`batches`, else what it read
        through ``ctx.data`` (``table()``, ``stream()``, ``load()``) before making arrays of its own."""
        return self._tabular if self._tabular is not None else self.data.given

    def _classes(self, classes: list[Any] | None, task: str) -> list[Any] | None:
        """The label of each output: as given, else the classes of the rows the function read.

        Raises:
            InputError: a classification function that read its rows some other way (``ctx.data.frame()``,
                its own files) gave none: its own encoding of the labels is not ours to guess.
        """
        if classes is not None or task != "classification":
            return classes
        rows = self._source_rows()
        if rows is None:
            raise InputError(
                "save_model: give classes= (the label of each of the model's outputs, in order): the function "
                "encoded its labels itself, not through ctx.data.table(), .stream() or .load()"
            )
        return list(rows.classes)

    # --- what live telemetry reads ----------------------------------------------------------------

    def progress_ratio(self) -> float | None:
        """The share of the run's batches done (None before :meth:`batches` knows how many)."""
        planned = self.loop.planned_batches()
        return min(self.batches_done / planned, 1.0) if planned else None

    def eta_seconds(self) -> float | None:
        """Seconds left at this process's rate (None before it has one)."""
        return self.loop.progress.eta() if self.loop.progress is not None else None

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
        saved (else one line), the end of a run it left early (a ``break`` out of :meth:`batches`:
        the partial epoch's metrics, a final checkpoint), this rank's telemetry written, and no rank
        gone before rank 0 has written the model (across nodes, the node that reports it may not be
        the one that wrote it).

        Raises:
            InputError: the function never stepped or never saved its model.
            Preempted: the platform asked the job to stop as the run ended early (its checkpoint written first).
        """
        self.wait_for_checkpoints()
        spec = self.settings.train_function
        if self.global_step == 0:
            raise InputError(f"train_function: {spec} returned without calling ctx.step: nothing was trained")
        if not self._model_saved:
            raise InputError(
                f"train_function: {spec} returned without calling ctx.save_model: there is no model to register"
            )
        self.loop.leave()
        self.write_telemetry()
        self._last_barrier()

    def _last_barrier(self) -> None:
        self._barrier()

    def telemetry(self) -> dict[str, Any]:
        """This rank's telemetry (profile_training reads it); a backend adds its own fields."""
        return self.loop.record(self.dist_name, self._t0)

    def write_telemetry(self) -> None:
        """This rank's telemetry file: this run's record (where it resumed from, what it used). A rerun
        that found its training already finished (nothing left to step through) carries over the step
        records of the run that did the training (``steps_from_earlier_run``), which profile_training reads."""
        path = self.out / TELEMETRY_DIR / f"rank{self.rank}.json"
        record = self.telemetry()
        if not record["steps"] and path.exists():
            try:
                earlier = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                earlier = {}
            if earlier.get("steps"):
                record["steps"], record["steps_from_earlier_run"] = earlier["steps"], True
        atomic_write_json(path, record)

    def close(self) -> None:
        """Release what the backend holds (a write in flight is waited for: a failing run reports its own error)."""
        try:
            self.wait_for_checkpoints()
        except BaseException:  # noqa: BLE001,S110 (the run's own error is the one to report)
            pass
