"""Step timing on a GPU without synchronizing it: each mark is a CUDA event on the training stream,
read once the device has passed it (a batch or two later), so the host keeps running ahead of the
device as a hand-written loop does. A batch's time is the device's, from the end of the previous
batch to the end of this one: the records are contiguous, and over any window they add up to the
wall time the device took. Imports torch.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

from trainpipe.training.timing import StepTimer, step_record


class CudaTimer(StepTimer):
    """A :class:`~trainpipe.training.timing.StepTimer` of CUDA events."""

    def __init__(self, framework: str, t0: float, device: torch.device) -> None:
        super().__init__(framework, t0)
        self.device = device
        self._events: dict[str, Any] = {}
        self._pending: deque[tuple[str, Any, Any]] = deque()
        self._origin: Any = None
        self._origin_host = 0.0
        self._prev_event: Any = None

    def _record(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def begin(self) -> None:
        """Once, before the first batch: the device is idle, so the origin event's time is the host's."""
        torch.cuda.synchronize(self.device)
        self._origin, self._origin_host = self._record(), time.perf_counter()
        self._prev_event = self._origin

    def mark(self, name: str) -> None:
        self._events[name] = self._record()

    def batch_start(self) -> None:
        self._events = {"start": self._prev_event}

    def finish_batch(self, epoch: int, step: int, samples: int) -> None:
        self.mark("done")
        self._pending.append(("batch", self._events, (epoch, step, samples)))
        self._prev_event = self._events["done"]
        self._events = {}
        self.drain()

    def extend_last(self) -> None:
        end = self._record()
        self._pending.append(("extend", self._prev_event, end))
        self._prev_event = end

    def drain(self, wait: bool = False) -> None:
        """Turn the events the device has passed into records (all of them, waiting, with ``wait``)."""
        while self._pending:
            kind, a, b = self._pending[0]
            last = a["done"] if kind == "batch" else b
            if wait:
                last.synchronize()
            elif not last.query():
                return
            self._pending.popleft()
            if kind == "batch":
                at = {k: self._origin.elapsed_time(ev) / 1000.0 for k, ev in a.items()}
                epoch, step, samples = b
                rec = {"epoch": epoch, "step": step, "samples": samples, **step_record(at, self.framework)}
                self.records.append({**rec, "t": self._origin_host - self.t0 + at["done"]})
            elif self.records:
                extra = a.elapsed_time(b) / 1000.0
                self.records[-1]["other_s"] += extra
                self.records[-1]["step_s"] += extra
