"""The one training driver: what every backend's context shares, framework-free.

A training function owns its loop; the context owns what surrounds it: how many batches an
epoch has and where a resumed run picks up, when a checkpoint is taken (between batches, after
the step's ``log`` calls, so a resumed run reproduces the metrics too), the epoch metrics
(``ctx.log`` values, reduced over ranks at each epoch end), the per-step telemetry
profile_training reads, and fault injection for tests. A backend subclass supplies the
framework parts: moving a batch, reducing numbers over ranks, saving and loading state.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from trainpipe.contract.errors import InputError, TrainpipeError
from trainpipe.contract.io import atomic_write_json, atomic_write_text

FAULT_ENV = "TRAINPIPE_FAULT"
METRICS_FILE = "metrics.jsonl"
TELEMETRY_DIR = "telemetry"
CHECKPOINT_DIR = "checkpoints"
CKPT_PREFIX = "ckpt-"
#: Logged values are kept as the framework's tensors (no host copy per step) and added up this often.
FOLD_EVERY = 512


def attempt() -> int:
    """Which restart of the worker group this is (0 for the first run)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("TRAINPIPE_ATTEMPT") or 0)


@dataclass
class Fault:
    """A fault to inject, from ``TRAINPIPE_FAULT`` (tests only; honoured on the first attempt).

    ``kill:RANK:STEP`` SIGKILLs rank RANK before global step STEP, once the checkpoints it has
    started are written (so the step a retry resumes from does not depend on the machine's load);
    ``kill_checkpoint:STEP`` SIGKILLs rank 0 half way through writing checkpoint STEP (its data
    written, its metadata not).
    """

    kind: str = ""
    rank: int = -1
    step: int = -1

    @classmethod
    def from_env(cls) -> "Fault":
        raw = os.environ.get(FAULT_ENV, "")
        if not raw or attempt() > 0:
            return cls()
        parts = raw.split(":")
        try:
            if parts[0] == "kill" and len(parts) == 3:
                return cls("kill", int(parts[1]), int(parts[2]))
            if parts[0] == "kill_checkpoint" and len(parts) == 2:
                return cls("kill_checkpoint", 0, int(parts[1]))
        except ValueError:
            pass
        raise InputError(f"{FAULT_ENV}: {raw!r} is not kill:RANK:STEP or kill_checkpoint:STEP")

    def maybe_kill(self, kind: str, rank: int, step: int, before: Callable[[], None] | None = None) -> None:
        if self.kind == kind and self.rank == rank and self.step == step:
            if before is not None:
                before()
            print(f"train_model rank {rank}: injected fault {kind} at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_name(step: int) -> str:
    return f"{CKPT_PREFIX}{step:010d}"


def completed_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Checkpoint folders whose writing finished (renamed into place), oldest first."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith(CKPT_PREFIX) and p.name[len(CKPT_PREFIX):].isdigit())


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
        self.data = Snapshot(settings.data, settings.label_column, settings.task, settings.test_fraction, settings.seed, settings.batch_size)
        self.epoch = 0
        self.global_step = 0
        self.batches_done = 0
        self.resumed_from = 0
        self.steps_per_epoch = 0
        self.history: list[dict[str, Any]] = []
        self._pending: dict[str, list[Any]] = {}
        self._folded: dict[str, list[float]] = {}  # key -> [sum, count] on this rank since the epoch's last reduction
        self._carried: dict[str, list[float]] = {}  # key -> [sum, count] over every rank, reduced at checkpoints
        self._state: dict[str, Any] | None = None  # registered by restore()
        self._tabular: Any = None  # trainpipe's own data source, when batches() was given one (its classes, an example)
        self._batches_started = False
        self._model_saved = False
        self.step_records: list[dict[str, float]] = []
        self._t0 = time.perf_counter()
        self._marks: dict[str, float] = {}
        self.first_step_s: float | None = None
        self.first_step_unix: float | None = None
        # what live telemetry reads (trainpipe.telemetry, on the metrics server's thread)
        self.restarts = attempt()
        self.last_checkpoint_unix: float | None = None
        self._last_logged: dict[str, Any] = {}
        self._progress: Any = None

    # --- what a backend supplies ----------------------------------------------------------------

    def _array(self, values: Any) -> Any:
        """One of a tuple's or dict's arrays, as the framework holds it for indexing."""
        raise NotImplementedError

    def _indices(self, rows: Any) -> Any:
        """An epoch's row indices (numpy, one row of indices a batch) as :meth:`_take` takes them."""
        return rows

    def _take(self, array: Any, rows: Any) -> Any:
        """Rows (one row of :meth:`_indices`) of an :meth:`_array`, as a batch on this rank's device."""
        raise NotImplementedError

    def _from_host(self, batch: Any) -> Any:
        """A numpy batch a stream gave, as a batch on this rank's device."""
        raise NotImplementedError

    def _plan_other(self, source: Any) -> tuple[int, Callable[[int, int], Iterator[Any]]]:
        """A source only this backend iterates (torch: a map-style dataset)."""
        raise InputError(f"train_function: ctx.batches with backend {self.settings.backend} takes TabularData, a ParquetStream, "
                         f"a tuple or dict of arrays, or a StreamSource, not {type(source).__name__}")

    def _plan(self, source: Any) -> tuple[int, Callable[[int, int], Iterator[Any]]]:
        """``(batches per epoch, iterate)`` of a source, where ``iterate(epoch, skip)`` yields this
        rank's batches of ``epoch`` after the first ``skip``, on the device."""
        from trainpipe.training.data import ParquetStream, StreamSource, TabularData, rank_batches, steps_per_epoch

        s, local = self.settings, self.local_batch_size
        if isinstance(source, (TabularData, ParquetStream)):
            self._tabular = source
        if isinstance(source, StreamSource) and not isinstance(source, (tuple, list, dict)):
            def stream(epoch: int, skip: int) -> Iterator[Any]:
                for batch in source.local_batches(epoch, self.rank, self.world_size, local, s.seed, skip):
                    yield tuple(self._from_host(b) for b in batch)

            return source.batches_per_epoch(self.world_size, local), stream
        if isinstance(source, TabularData):
            source = (source.x, source.y)
        if not isinstance(source, (tuple, list, dict)):
            return self._plan_other(source)
        keys = list(source) if isinstance(source, dict) else None
        arrays = [self._array(source[k]) for k in keys] if keys else [self._array(a) for a in source]
        lengths = {int(a.shape[0]) for a in arrays}
        if len(lengths) != 1:
            raise InputError(f"train_function: ctx.batches got arrays of different lengths {sorted(lengths)}")
        n = lengths.pop()

        def arrays_iter(epoch: int, skip: int) -> Iterator[Any]:
            for rows in self._indices(rank_batches(n, s.batch_size, s.seed, epoch, self.rank, self.world_size, skip)):
                picked = [self._take(a, rows) for a in arrays]
                yield dict(zip(keys, picked)) if keys else tuple(picked)

        return steps_per_epoch(n, s.batch_size), arrays_iter

    def _fold(self, values: list[Any]) -> float:
        """The sum of logged values (framework tensors or numbers), as a host float."""
        return float(sum(float(v) for v in values))

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        raise NotImplementedError

    def _save_state(self, tmp: Path, final: Path, trainer: dict[str, Any]) -> None:
        """Write the registered state into ``tmp`` and, once every rank's part is written, rename
        it to ``final`` (may finish on a background thread)."""
        raise NotImplementedError

    def _load_state(self, path: Path) -> None:
        """Load the registered state from a completed checkpoint folder (every rank)."""
        raise NotImplementedError

    def _wait_writes(self) -> None:
        """Wait for a checkpoint being written in the background; re-raise its error."""

    def _sync(self) -> None:
        """Wait for the device (so step times are real)."""

    def _on_batch_end(self) -> None:
        """After each batch's bookkeeping (the profiler's step)."""

    def _validate_state(self, objects: dict[str, Any]) -> None:
        """Refuse objects this backend cannot checkpoint (one line)."""

    def _ready_checkpoints(self) -> None:
        """Load what writing a checkpoint needs, before the loop: its one-time cost is start-up, not a step's."""

    def peer_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a collective that failed because a peer died or hung (restartable)."""
        return False

    # --- state ----------------------------------------------------------------------------------

    def restore(self, **objects: Any) -> int:
        """Register what a checkpoint holds and load the newest checkpoint into it.

        Call once, after the model is prepared and the optimizer made, before :meth:`batches`.
        Every object is restored in place: modules, optimizers, schedulers, anything with
        ``state_dict``/``load_state_dict``. With it the run checkpoints every
        ``checkpoint_every_steps`` steps and at every epoch end (with the RNG states and the
        data position), and a rerun or a restarted group continues exactly where it stopped.

        Returns:
            The global step it resumed from (0 on a fresh start).

        Raises:
            InputError: called twice, after :meth:`batches`, or with an object that has no state.
        """
        if self._state is not None:
            raise InputError("train_function: ctx.restore was called twice; register every object in one call")
        if self._batches_started:
            raise InputError("train_function: ctx.restore must come before ctx.batches (it sets where the data resumes)")
        if not objects:
            raise InputError("train_function: ctx.restore needs the objects to checkpoint, e.g. ctx.restore(model=model, optimizer=opt)")
        self._validate_state(objects)
        self._state = dict(objects)
        self._ready_checkpoints()
        if self.is_chief and self.ckpt_dir.is_dir():
            import shutil

            for stale in self.ckpt_dir.glob(f".{CKPT_PREFIX}*.tmp"):  # writes a killed run left behind
                shutil.rmtree(stale, ignore_errors=True)
        self._barrier()
        for path in reversed(completed_checkpoints(self.ckpt_dir)):
            try:
                trainer = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
                self._load_state(path)
            except BaseException as exc:  # a torn or foreign checkpoint: fall back to the one before
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                if self.is_chief:
                    print(f"train_model: warning: skipping unreadable checkpoint {path.name}: {first[:200]}", file=sys.stderr)
                continue
            self.global_step = int(trainer["global_step"])
            self.batches_done = int(trainer["batches_done"])
            self._carried = {k: list(v) for k, v in trainer.get("carried", {}).items()}
            self.history = list(trainer.get("history", []))
            self.resumed_from = self.global_step
            if self.is_chief:
                print(f"train_model: resuming from {path.name} (step {self.global_step})", file=sys.stderr)
            break
        # every rank must resume from the same step: a rank that read another folder would diverge
        s, s2 = self._all_reduce_sum([float(self.global_step), float(self.global_step) ** 2])
        if s * s != self.world_size * s2:
            raise TrainpipeError("checkpoint: ranks loaded different checkpoints; is checkpoint_dir shared by every node?")
        return self.global_step

    def _barrier(self) -> None:
        self._all_reduce_sum([0.0])

    def _last_barrier(self) -> None:
        """The barrier before the ranks leave: none leaves before rank 0 has written the model."""
        self._barrier()

    def _trainer_state(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "batches_done": self.batches_done, "epoch": self.epoch,
                "carried": self._carried, "history": self.history, "world_size": self.world_size}

    def _checkpoint(self) -> None:
        if self._state is None:
            return
        self.last_checkpoint_unix = time.time()
        name = checkpoint_name(self.global_step)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self._save_state(self.ckpt_dir / f".{name}.tmp", self.ckpt_dir / name, self._trainer_state())

    def _finalize_checkpoint(self, tmp: Path, final: Path, trainer: dict[str, Any]) -> None:
        """Rank 0, once every rank's part is on disk: trainer.json, then the rename, then pruning."""
        import shutil

        from trainpipe.contract.io import _fsync_dir

        atomic_write_json(tmp / "trainer.json", trainer)
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        for old in completed_checkpoints(final.parent)[: -self.settings.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    # --- data -----------------------------------------------------------------------------------

    @property
    def local_batch_size(self) -> int:
        return self.settings.batch_size // self.world_size

    def batches(self, source: Any) -> Iterator[Any]:
        """Every batch of the run, epoch after epoch, this rank's share, on this rank's device.

        A source is trainpipe's :class:`~trainpipe.training.data.TabularData` (yields ``(x, y)``),
        a :class:`~trainpipe.training.data.ParquetStream`, a tuple or dict of arrays or tensors
        of equal length (yields the same shape), a map-style dataset, or any
        :class:`~trainpipe.training.data.StreamSource`. The global batch is ``batch_size``; each
        rank gets ``batch_size / world_size`` rows. The order is seeded by ``seed`` and the epoch;
        a resumed run starts at the batch after its checkpoint. Epoch ends (metrics, checkpoint)
        happen inside the iteration. Call it once per run.

        Raises:
            InputError: called twice, or the source has fewer rows than one global batch.
        """
        if self._batches_started:
            raise InputError("train_function: ctx.batches was called twice; iterate one call over the whole run (it spans every epoch)")
        self._batches_started = True
        if self._state is None and self.is_chief:
            print("train_model: warning: the training function registered no state with ctx.restore: "
                  "this run neither checkpoints nor resumes", file=sys.stderr)
        s = self.settings
        per_epoch, iterate = self._plan(source)
        if per_epoch < 1:
            raise InputError(f"batch_size: {s.batch_size} is larger than the rows the training data gives each epoch")
        self.steps_per_epoch = per_epoch
        from trainpipe.telemetry import Progress

        self._progress = Progress("train_model", self._planned_batches(), "batches", start=self.batches_done,
                                  rate_unit=("samples", float(s.batch_size)), show=self.is_chief)
        start_epoch, skip = divmod(self.batches_done, per_epoch)
        for epoch in range(start_epoch, s.epochs):
            if self._done():
                break
            self.epoch = epoch
            it = iterate(epoch, skip if epoch == start_epoch else 0)
            t_prev = time.perf_counter()
            for batch in it:
                if self._done():
                    break
                self.fault.maybe_kill("kill", self.rank, self.global_step, before=self._wait_writes)
                step_before = self.global_step
                self._marks = {"start": t_prev, "ready": time.perf_counter()}
                yield batch
                t_back = time.perf_counter()
                self.batches_done += 1
                epoch_done = self.batches_done % per_epoch == 0
                if (s.checkpoint_every_steps and self.global_step > step_before and self.global_step % s.checkpoint_every_steps == 0
                        and not epoch_done and not self._done()):
                    self._reduce_into_carried()
                    self._checkpoint()
                self._record(t_back)
                self._progress.update(self.batches_done)
                self._on_batch_end()
                t_prev = time.perf_counter()
            t_end = time.perf_counter()
            self._end_epoch(epoch)
            if self.step_records:
                rec = self.step_records[-1]
                extra = time.perf_counter() - t_end
                rec["other_s"] += extra
                rec["step_s"] += extra
        self._wait_writes()
        self._progress.finish()

    def _done(self) -> bool:
        return self.settings.max_steps is not None and self.global_step >= self.settings.max_steps

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
        out = {}
        for key, value in list(self._last_logged.items()):
            try:
                out[key] = float(value)
            except (TypeError, ValueError, RuntimeError):
                continue
        return out

    def device_figures(self) -> dict[str, Any]:
        """Accelerator figures: ``peak_memory_bytes`` and per-GPU NVML readings (none on CPU)."""
        return {}

    # --- steps and timing -----------------------------------------------------------------------

    def _mark(self, name: str) -> None:
        self._marks[name] = time.perf_counter()

    def _count_step(self) -> None:
        """One optimizer step taken (a backend's ``step`` calls this last)."""
        self.global_step += 1
        if self.first_step_s is None:
            self.first_step_s, self.first_step_unix = time.perf_counter() - self._t0, time.time()

    def _record(self, t_back: float) -> None:
        m = self._marks
        start, ready = m.get("start", t_back), m.get("ready", t_back)
        done = time.perf_counter()
        rec = {"epoch": self.epoch, "step": self.global_step, "samples": self.local_batch_size, "data_s": ready - start}
        if "step_start" in m and self.framework == "tensorflow":
            rec.update({"compute_s": m["step_end"] - m["step_start"], "other_s": (m["step_start"] - ready) + (done - m["step_end"])})
        elif "step_start" in m:
            fwd_end = m.get("backward_start", m["step_start"])
            bwd = (m["backward_end"] - m["backward_start"]) if "backward_end" in m else 0.0
            rec.update({"forward_s": fwd_end - ready, "backward_s": bwd, "optimizer_s": m["step_end"] - m["step_start"],
                        "other_s": (m["step_start"] - m.get("backward_end", fwd_end)) + (done - m["step_end"])})
        else:  # a batch with no optimizer step (gradient accumulation)
            rec.update({"forward_s": t_back - ready, "backward_s": 0.0, "optimizer_s": 0.0, "other_s": done - t_back}
                       if self.framework != "tensorflow" else {"compute_s": t_back - ready, "other_s": done - t_back})
        rec["step_s"] = done - start
        rec["t"] = done - self._t0
        self.step_records.append(rec)

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
            builder: What rebuilds it, a callable or ``"package.module:Name"`` (default: its class; required with TensorFlow, a function returning the Keras model).
            classes: The label of each output (classification; default: the data's classes).
            task: ``classification`` or ``regression`` (default: the settings').

        Raises:
            InputError: it cannot be rebuilt from what is given, its code cannot travel, or it
                fails on the example.
        """
        self._save_model(model, input_example, init_args, builder, classes, task or self.settings.task)

    def _save_model(self, model: Any, input_example: Any, init_args: dict[str, Any] | None, builder: Any, classes: list[Any] | None, task: str) -> None:
        raise NotImplementedError

    # --- metrics --------------------------------------------------------------------------------

    def log(self, **values: Any) -> None:
        """Record this step's values (the loss, an accuracy; tensors are fine: no device sync).

        Each epoch's line in ``metrics.jsonl`` (and the MLflow run) holds every key's mean over
        the epoch's steps and every rank. Every rank must log the same keys.
        """
        self._last_logged.update(values)
        for key, value in values.items():
            pending = self._pending.setdefault(key, [])
            pending.append(self._keep(value))
            if len(pending) >= FOLD_EVERY:
                self._fold_key(key)

    def _keep(self, value: Any) -> Any:
        return value

    def _fold_key(self, key: str) -> None:
        values = self._pending.get(key) or []
        if values:
            acc = self._folded.setdefault(key, [0.0, 0.0])
            acc[0] += self._fold(values)
            acc[1] += len(values)
            self._pending[key] = []

    def _reduce(self) -> dict[str, list[float]]:
        """This epoch's sums since the last reduction, over every rank (a collective)."""
        for key in list(self._pending):
            self._fold_key(key)
        keys = sorted(set(self._folded) | set(self._carried))
        digest = int(hashlib.sha256("\0".join(keys).encode()).hexdigest()[:8], 16)
        flat = [x for k in keys for x in self._folded.get(k, [0.0, 0.0])] + [float(digest)]
        total = self._all_reduce_sum(flat)
        if total[-1] != digest * self.world_size:
            raise InputError("train_function: the ranks logged different keys with ctx.log; every rank must log the same ones")
        self._folded = {}
        return {k: [total[2 * i], total[2 * i + 1]] for i, k in enumerate(keys)}

    def _reduce_into_carried(self) -> None:
        for k, (s, c) in self._reduce().items():
            acc = self._carried.setdefault(k, [0.0, 0.0])
            acc[0] += s
            acc[1] += c

    def _end_epoch(self, epoch: int) -> None:
        self._reduce_into_carried()
        means = {k: (s / c if c else float("nan")) for k, (s, c) in sorted(self._carried.items())}
        self._carried = {}
        line = {"epoch": epoch, "step": self.global_step, **means}
        self.history.append(line)
        if self.is_chief:
            atomic_write_text(self.out / METRICS_FILE, "".join(json.dumps(h, sort_keys=True) + "\n" for h in self.history))
            shown = " ".join(f"{k} {v:.4f}" for k, v in means.items())
            print(f"train_model: epoch {epoch + 1}/{self.settings.epochs} step {self.global_step} {shown}".rstrip(), file=sys.stderr, flush=True)
        self._checkpoint()

    # --- the end ----------------------------------------------------------------------------------

    def telemetry(self) -> dict[str, Any]:
        """This rank's telemetry (profile_training reads it); a backend adds its own fields."""
        import resource

        from trainpipe.resources import usable_cpus

        usage = resource.getrusage(resource.RUSAGE_SELF)
        s = self.settings
        return {
            "rank": self.rank, "world_size": self.world_size, "backend": s.backend, "dist_backend": self.dist_name,
            "precision": s.precision, "batch_size": s.batch_size, "wall_s": time.perf_counter() - self._t0,
            "time_to_first_step_s": self.first_step_s, "resumed_from_step": self.resumed_from, "global_steps": self.global_step, "first_step_unix": self.first_step_unix,
            "cpu_s": usage.ru_utime + usage.ru_stime, "usable_cpus": usable_cpus(), "peak_rss_mb": usage.ru_maxrss / 1024.0,
            "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("HOROVOD_LOCAL_SIZE", self.world_size))),
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


def resolve_function(spec: str) -> Callable[..., Any]:
    """The training function ``spec`` names: ``builtin:<name>`` or ``package.module:function``.

    Raises:
        InputError: it cannot be imported, is not callable, or cannot be called as ``f(ctx, config)``.
    """
    import importlib
    import inspect

    if spec.startswith("builtin:"):
        return _builtin(spec)
    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"train_function: cannot import {module_name!r} for {spec!r}: {exc}") from None
    except Exception as exc:
        raise InputError(f"train_function: importing {module_name!r} raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    func: Any = module
    for part in func_name.split("."):
        func = getattr(func, part, None)
    if func is None or not callable(func):
        raise InputError(f"train_function: {module_name!r} has no function {func_name!r}")
    try:
        inspect.signature(func).bind(object(), {})
    except TypeError:
        raise InputError(f"train_function: {spec} takes {inspect.signature(func)}, but trainpipe calls it as f(ctx, config)") from None
    except ValueError:
        pass  # a builtin without a signature: it will tell when called
    return func


def _builtin(spec: str) -> Callable[..., Any]:
    name = spec.split(":", 1)[1]
    from trainpipe.training import builtin

    func = builtin.FUNCTIONS.get(name)
    if func is None:
        raise InputError(f"train_function: unknown built-in {spec!r} (built in: {', '.join('builtin:' + n for n in builtin.FUNCTIONS)})")
    return func
