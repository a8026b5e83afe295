"""Control points: where the ranks agree, in one small collective, on what only some of them may
know yet: that the platform asked the job to stop (SIGTERM: a pod deleted, Kueue preempting a
lower priority, a spot node reclaimed; SIGUSR1: Slurm's warning before the time limit), or that
the checkpoint interval passed by some rank's clock. Every rank acts on the agreed answer at the
same step, so a checkpoint (a collective write) starts on all of them together.

A control point is one all-reduce of four numbers on the host, never a device synchronization.
They come before the first batch, at every epoch end, and about once a second in between: the
number of batches to the next one follows the step time, computed from the agreed figures, so it
is the same on every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.contract import errors

if TYPE_CHECKING:
    from trainpipe.training.tracking_run import TrackingThread

#: The signals that ask a training to checkpoint and stop (exit 75) so that a retry resumes it.
PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1")
#: Seconds between control points (the bound on how late a preemption is noticed).
EVERY_S = 1.0
MAX_INTERVAL = 100_000

#: The first preemption signal this process caught (one process is one rank).
_received: list[str] = []


def install(pid_dir: str | None = None) -> None:
    """Catch the preemption signals (main thread only), so the rank finishes its step instead of
    dying, then register this process in ``pid_dir`` (the launcher passes the signals on to the
    ranks registered there). A rank calls it first thing, before its heavy imports."""
    if threading.current_thread() is threading.main_thread():
        for name in PREEMPT_SIGNALS:
            signal.signal(getattr(signal, name), _on_signal)
    if pid_dir:
        Path(pid_dir, str(os.getpid())).touch()


def _on_signal(signum: int, _frame: object) -> None:
    if not _received:
        _received.append(signal.Signals(signum).name)


def request(signum: int) -> None:
    """As if the platform's signal had arrived (fault injection: the same path a caught signal takes)."""
    _on_signal(signum, None)


def received() -> str | None:
    """The preemption signal this process caught, if any."""
    return _received[0] if _received else None


@dataclass(frozen=True)
class Decision:
    """What the ranks agreed at a control point."""

    preempt: str | None  # the signal's name when any rank received one
    time_due: bool  # the checkpoint interval passed by some rank's clock


class Control:
    """The schedule of a rank's control points, and what they agree."""

    def __init__(self, world_size: int, every_s: float = EVERY_S) -> None:
        self.world_size, self.every_s = world_size, every_s
        self._interval = 1
        self._next = 0
        self._last_batches = 0
        self._t = time.monotonic()

    def due(self, batches_done: int) -> bool:
        """Whether a control point falls after this many batches."""
        return batches_done >= self._next

    def agree(
        self, batches_done: int, time_due: bool, all_reduce_sum: Callable[[list[float]], list[float]]
    ) -> Decision:
        """Agree with the other ranks (a collective: every rank calls it at the same batch)."""
        now = time.monotonic()
        caught = received()
        local = [float(caught == "SIGTERM"), float(caught == "SIGUSR1"), float(time_due), round(now - self._t, 6)]
        term, usr1, due, elapsed = all_reduce_sum(local)
        self._schedule(batches_done, elapsed)
        self._t = now
        preempt = "SIGUSR1" if usr1 else "SIGTERM" if term else None
        return Decision(preempt, bool(due))

    def _schedule(self, batches_done: int, elapsed_sum: float) -> None:
        """The next control point, from the batches' agreed time (the same on every rank)."""
        ran = batches_done - self._last_batches
        if ran > 0 and elapsed_sum > 0:
            per_batch = elapsed_sum / self.world_size / ran
            self._interval = min(max(1, round(self.every_s / per_batch)), 10 * self._interval, MAX_INTERVAL)
        self._last_batches = batches_done
        self._next = batches_done + self._interval


#: Set on a training whose chief asks a judge outside, at each epoch's end, whether to go on (a tuning study's
#: pruner): the path of the judge's Unix socket. The chief sends the epoch's line (its metrics.jsonl line) and
#: waits for one byte: ``c`` go on, ``s`` stop here, which the ranks agree at this epoch end's control point
#: (as on a preemption signal, without one). No judge there, or gone: the training goes on without asking.
EPOCH_GATE_ENV = "TRAINPIPE_EPOCH_GATE"


class EpochGate:
    """The chief's side of :data:`EPOCH_GATE_ENV`: one question per epoch end, one answer each, so the judge's
    decision on an epoch holds the ranks at that epoch's end, never a later one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._closed = False

    @classmethod
    def from_env(cls) -> EpochGate | None:
        path = os.environ.get(EPOCH_GATE_ENV)
        return cls(path) if path else None

    def ask(self, line: dict[str, Any]) -> bool:
        """Send the epoch's line and wait for the judge: True to stop here. Never raises: a judge that cannot
        be reached, or that went away, lets the training go on (it is asked no more)."""
        if self._closed:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._sock.connect(self.path)
            self._sock.sendall((json.dumps(line, sort_keys=True) + "\n").encode("utf-8"))
            answer = self._sock.recv(1)
        except OSError:
            answer = b""
        if not answer:
            self.close()
        return answer == b"s"

    def close(self) -> None:
        self._closed = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


class Stopped(BaseException):
    """The platform's stop signal, raised where the launcher was (no rank running): see :class:`PlatformStop`."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal = signal_name


class PlatformStop:
    """The platform's stop (SIGTERM: a pod deleted, a preemption; SIGUSR1: Slurm's warning) while no rank
    trains: before the ranks start, or once they finished while the step logs the model. It ends the step
    at once, exit 75 and one line, its MLflow run marked KILLED (never left RUNNING) and its checkpoints
    kept, so the retry resumes (after the last step: it only logs the model). While the ranks run the
    launcher handles these signals, and passes on to this one a signal the ranks finished before acting on.

    Attributes:
        signal: The signal's name, once one came.
        tracking: The training's MLflow run being opened (:class:`trainpipe.training.tracking_run.TrackingThread`).
        when: Where the step was, for the one line ("before its ranks started").
        failure: A rank's own error, once the step is failing on it (a stop then changes nothing of that).
    """

    def __init__(self) -> None:
        self.signal: str | None = None
        self.tracking: TrackingThread | None = None
        self.when = "before its ranks started"
        self.failure: errors.TrainpipeError | None = None
        self._previous: dict[str, Any] = {}

    def __enter__(self) -> PlatformStop:
        if threading.current_thread() is threading.main_thread():
            for name in PREEMPT_SIGNALS:
                self._previous[name] = signal.signal(getattr(signal, name), self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, handler in self._previous.items():
            signal.signal(getattr(signal, name), handler)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.signal is None:  # one stop: a second signal while it stops changes nothing
            self.signal = signal.Signals(signum).name
            raise Stopped(self.signal)


def rank_error(record: dict[str, Any]) -> errors.TrainpipeError:
    """The error a rank recorded (``<output_dir>/.errors/rank<N>.json``: its type's name and its one line), as the
    launcher raises it again: the same type, so the same exit code."""
    return getattr(errors, record.get("type", ""), errors.TrainpipeError)(record.get("message", "a rank failed"))


def rank_failure(folder: Path) -> errors.TrainpipeError | None:
    """A rank's own error in the ranks' error ``folder``, recorded before a stop came: what the step failed on
    (a retry would fail again); None when no rank recorded one, or only a preemption or a budget's stop."""
    for path in sorted(folder.glob("rank*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            err = json.loads(path.read_text(encoding="utf-8"))
            if err.get("type") not in ("Preempted", "BudgetReached"):
                return rank_error(err)
    return None
