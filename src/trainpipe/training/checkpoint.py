"""The checkpoint manager: which checkpoint a run resumes from, when the next one is due, and how
one is written without stalling the training loop.

A checkpoint is a folder ``ckpt-<step>`` in the checkpoint directory: the backend's state
(``torch.distributed.checkpoint`` files for torch, a ``tf.train.Checkpoint`` for TensorFlow), each
rank's RNG states and ``trainer.json`` (the loop's position and metrics). It is written under a
hidden ``.ckpt-<step>.tmp`` name and renamed once every rank's part is on disk, so no reader sees
half of one; the newest ``keep`` are kept.

Saving has two halves. **Staging** runs on the loop's thread: the backend copies the state into
buffers it keeps from one checkpoint to the next (pinned host memory filled on a side CUDA stream
on a GPU), which costs about one copy of the state. **Writing** runs on a background thread while
the loop goes on: the bytes go to disk, every rank's part is awaited and the chief renames the
folder. Only the next checkpoint waits for a write still in flight, and :meth:`figures` reports
that wait beside the staging stall and the write time. Framework-free: a backend supplies a
:class:`StateIO`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from trainpipe.contract.io import atomic_write_json, fsync_dir

CKPT_PREFIX = "ckpt-"
TRAINER_FILE = "trainer.json"
#: Per-checkpoint figures kept for telemetry (the totals count every checkpoint).
KEEP_FIGURES = 100


def checkpoint_name(step: int) -> str:
    return f"{CKPT_PREFIX}{step:010d}"


def completed_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Checkpoint folders whose writing finished (renamed into place), oldest first."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(
        p
        for p in ckpt_dir.iterdir()
        if p.is_dir() and p.name.startswith(CKPT_PREFIX) and p.name[len(CKPT_PREFIX) :].isdigit()
    )


class StateIO(Protocol):
    """How a backend copies, writes and reads the state a training function registered."""

    def prepare(self) -> None:
        """Allocate what staging reuses (a one-time cost, paid before the loop's steps count)."""

    def stage(self, tmp: Path, step: int) -> Callable[[], None] | None:
        """Copy the state as it is now; the loop waits for this and nothing more.

        Returns:
            What writes the staged copy into ``tmp`` (run on the writer thread), or None when the
            state was written already (a backend that writes synchronously).
        """

    def load(self, path: Path) -> None:
        """Load a completed checkpoint folder into the registered objects, in place."""

    @property
    def staged_bytes(self) -> int:
        """Bytes one staged copy of the state holds on this rank."""


class CheckpointManager:
    """Owns a run's checkpoints: resuming, cadence, staging, the background writer and pruning.

    Args:
        directory: Where the checkpoint folders go (shared by every node of a job).
        keep: How many completed checkpoints to keep.
        every_steps: A checkpoint every this many optimizer steps (0: none by count).
        every_s: A checkpoint once this many seconds passed since the last (0: none by time).
        io: The backend's state.
        chief: Whether this rank renames and prunes.
    """

    def __init__(
        self, directory: Path, keep: int, every_steps: int, every_s: float, io: StateIO, *, chief: bool
    ) -> None:
        self.directory, self.keep, self.every_steps, self.every_s = directory, keep, every_steps, every_s
        self.io, self.chief = io, chief
        self.last_step: int | None = None
        self.last_unix: float | None = None
        self._since = time.monotonic()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.saves = 0
        self.totals = {"stall_s": 0.0, "wait_s": 0.0, "write_s": 0.0}
        self.recent: dict[str, list[float]] = {"stall_s": [], "wait_s": [], "write_s": []}

    # --- resuming -------------------------------------------------------------------------------

    def remove_stale(self) -> None:
        """The chief removes the hidden folders a killed writer left behind."""
        if self.chief and self.directory.is_dir():
            for stale in self.directory.glob(f".{CKPT_PREFIX}*.tmp"):
                shutil.rmtree(stale, ignore_errors=True)

    def load_newest(self) -> dict[str, Any] | None:
        """Load the newest readable checkpoint; a torn or foreign one is skipped with a warning.

        Returns:
            Its trainer state, or None when there is none to resume from.
        """
        for path in reversed(completed_checkpoints(self.directory)):
            try:
                trainer = json.loads((path / TRAINER_FILE).read_text(encoding="utf-8"))
                self.io.load(path)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 (whatever a torn file raises, the one before is tried)
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                if self.chief:
                    print(
                        f"train_model: warning: skipping unreadable checkpoint {path.name}: {first[:200]}",
                        file=sys.stderr,
                    )
                continue
            self.last_step = int(trainer["global_step"])
            if self.chief:
                print(f"train_model: resuming from {path.name} (step {self.last_step})", file=sys.stderr)
            return trainer
        return None

    # --- cadence --------------------------------------------------------------------------------

    def start_clock(self) -> None:
        """Time cadence counts from here (the loop's first batch), not from start-up."""
        self._since = time.monotonic()

    def steps_due(self, step: int) -> bool:
        return bool(self.every_steps) and step % self.every_steps == 0 and step != self.last_step

    def time_due(self) -> bool:
        """Whether ``every_s`` passed since the last checkpoint by this rank's clock (the loop
        agrees with the other ranks before acting on it)."""
        return bool(self.every_s) and time.monotonic() - self._since >= self.every_s

    # --- saving ---------------------------------------------------------------------------------

    def save(self, step: int, trainer: dict[str, Any]) -> None:
        """Stage the state of ``step`` and write it in the background (every rank calls it)."""
        t0 = time.perf_counter()
        self.wait()
        t1 = time.perf_counter()
        name = checkpoint_name(step)
        tmp, final = self.directory / f".{name}.tmp", self.directory / name
        tmp.mkdir(parents=True, exist_ok=True)
        write = self.io.stage(tmp, step)
        t2 = time.perf_counter()
        self.last_step, self.last_unix, self._since = step, time.time(), time.monotonic()
        self.saves += 1
        self._add("wait_s", t1 - t0)
        self._add("stall_s", t2 - t1)
        finalize = (lambda: self._finalize(tmp, final, trainer)) if self.chief else None
        if write is None:  # written already: the chief renames it now
            if finalize is not None:
                finalize()
            return
        self._thread = threading.Thread(
            target=self._write, args=(write, finalize), name="trainpipe-checkpoint", daemon=True
        )
        self._thread.start()

    def _write(self, write: Callable[[], None], finalize: Callable[[], None] | None) -> None:
        # the training comes first: the writer takes the CPU the ranks leave (it needs little: the
        # disk reads the bytes itself), so the steps beside a write run at their own speed
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        t = time.perf_counter()
        try:
            write()
            if finalize is not None:
                finalize()
        except BaseException as exc:  # noqa: BLE001 (re-raised on the loop's thread by wait())
            self._error = exc
        self._add("write_s", time.perf_counter() - t)

    def wait(self) -> None:
        """Wait for the write in flight; re-raise what it failed with."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _finalize(self, tmp: Path, final: Path, trainer: dict[str, Any]) -> None:
        """The chief, once every rank's part is on disk: trainer.json, the rename, then pruning."""
        atomic_write_json(tmp / TRAINER_FILE, trainer)
        fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        for old in completed_checkpoints(final.parent)[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    # --- figures --------------------------------------------------------------------------------

    def _add(self, key: str, seconds: float) -> None:
        self.totals[key] += seconds
        kept = self.recent[key]
        kept.append(round(seconds, 6))
        del kept[:-KEEP_FIGURES]

    def figures(self) -> dict[str, Any]:
        """What checkpoints cost this rank: the loop's stall (staging) and wait (for the previous
        write), and the background write time, in total and for the last checkpoints."""
        return {
            "saved": self.saves,
            "staged_bytes": self.io.staged_bytes,
            "every_steps": self.every_steps,
            "every_s": self.every_s,
            "totals": {k: round(v, 6) for k, v in self.totals.items()},
            "recent": {k: list(v) for k, v in self.recent.items()},
        }


def discard_outputs(out: Path) -> None:
    """What a failed run wrote into its output folder besides its checkpoints (the ranks' errors and telemetry,
    the weights, their description and digest, the metrics, the serving examples): no half-made model is left to
    be read, and a rerun resumes from the checkpoints."""
    from trainpipe.contract.layout import EPOCH_METRICS_FILE, ERRORS_DIR, MODEL_FILE, MODEL_META, TELEMETRY_DIR
    from trainpipe.services.serving.package import INPUT_EXAMPLE_FILE, OUTPUT_EXAMPLE_FILE
    from trainpipe.training.weights_file import DIGEST_SUFFIX

    for name in (ERRORS_DIR, TELEMETRY_DIR):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (MODEL_FILE, MODEL_META, EPOCH_METRICS_FILE, INPUT_EXAMPLE_FILE, OUTPUT_EXAMPLE_FILE):
        (out / name).unlink(missing_ok=True)
    (out / f"{MODEL_FILE}{DIGEST_SUFFIX}").unlink(missing_ok=True)
