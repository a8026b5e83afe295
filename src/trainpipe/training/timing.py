"""Step timing: one record per batch that profile_training and live telemetry read, whose phases
add up to the step and whose steps add up to the run's wall time.

A batch's marks, in the order they happen: ``start`` (the previous batch's bookkeeping done),
``ready`` (the batch handed to the function), ``backward_start``/``backward_end`` (torch),
``step_start``/``step_end`` (the optimizer step), ``back`` (the function asks for the next batch)
and ``done`` (the loop's bookkeeping done). On a CPU the marks are the host's clock. On a GPU the
host runs ahead of the device, so :class:`~trainpipe.training.torch.timing.CudaTimer` marks the
stream with CUDA events instead and reads them once the device has passed them, never
synchronizing the device inside the loop.
"""

from __future__ import annotations

import time
from typing import Any

PHASE_MARKS = ("start", "ready", "backward_start", "backward_end", "step_start", "step_end", "back", "done")


def step_record(at: dict[str, float], framework: str) -> dict[str, float]:
    """A batch's phases (seconds) from its marks' times: contiguous, so they add up to ``step_s``."""
    start, ready, done = at["start"], at["ready"], at["done"]
    rec = {"data_s": ready - start}
    if "step_start" in at and framework == "tensorflow":
        rec.update(
            {
                "compute_s": at["step_end"] - at["step_start"],
                "other_s": (at["step_start"] - ready) + (done - at["step_end"]),
            }
        )
    elif "step_start" in at:
        fwd_end = at.get("backward_start", at["step_start"])
        bwd = at["backward_end"] - at["backward_start"] if "backward_end" in at else 0.0
        rec.update(
            {
                "forward_s": fwd_end - ready,
                "backward_s": bwd,
                "optimizer_s": at["step_end"] - at["step_start"],
                "other_s": (at["step_start"] - at.get("backward_end", fwd_end)) + (done - at["step_end"]),
            }
        )
    elif framework == "tensorflow":  # a batch with no optimizer step (gradient accumulation)
        rec.update({"compute_s": at["back"] - ready, "other_s": done - at["back"]})
    else:
        rec.update(
            {"forward_s": at["back"] - ready, "backward_s": 0.0, "optimizer_s": 0.0, "other_s": done - at["back"]}
        )
    rec["step_s"] = done - start
    return rec


class StepTimer:
    """The host's clock (CPU training, where every operation finishes before the next starts).

    A batch starts where the previous one ended (its ``done``, or the end of the work the loop did
    after it), so the records are contiguous: over any window their ``step_s`` add up to the wall
    time the window took.
    """

    def __init__(self, framework: str, t0: float) -> None:
        self.framework, self.t0 = framework, t0
        self.records: list[dict[str, Any]] = []
        self._at: dict[str, float] = {}
        self._prev_end = time.perf_counter()

    def begin(self) -> None:
        """The loop starts: the first batch's ``start``."""
        self._prev_end = time.perf_counter()

    def mark(self, name: str) -> None:
        self._at[name] = time.perf_counter()

    def batch_start(self) -> None:
        """A batch is about to be fetched: it starts where the last one ended."""
        self._at = {"start": self._prev_end}

    def finish_batch(self, epoch: int, step: int, samples: int) -> None:
        """Marks ``done`` and records the batch (one dict: the phases, then where the batch was)."""
        at = self._at
        done = at["done"] = time.perf_counter()
        rec = step_record(at, self.framework)
        rec["epoch"], rec["step"], rec["samples"], rec["t"] = epoch, step, samples, done - self.t0
        self.records.append(rec)
        self._prev_end = done

    def extend_last(self) -> None:
        """What the loop did after the last batch (an epoch's end: metrics, a checkpoint) belongs to it."""
        now = time.perf_counter()
        if self.records:
            extra = now - self._prev_end
            self.records[-1]["other_s"] += extra
            self.records[-1]["step_s"] += extra
        self._prev_end = now

    def drain(self, wait: bool = False) -> None:
        """Records not yet read (none on the host)."""
