"""What a run used and what it cost.

A hardware profile may declare :class:`Prices` (per GPU-hour, per CPU-core-hour, per node-hour, in a
named currency). A step measures its :class:`Usage` (wall time, GPU-seconds, CPU-core-seconds of
its processes, their peak memory) with a :class:`Meter`; where the profile is priced, the usage's
cost is reported beside it. The figures are the processes' own (the kernel's accounting of every
rank it waited for), not the requests of the pod.
"""

from __future__ import annotations

import resource
import time

from pydantic import BaseModel, ConfigDict, Field

from trainpipe.contract.config import StrictModel


class Prices(StrictModel):
    """What the enterprise's cost model charges for the hardware of a profile."""

    currency: str = Field("USD", pattern=r"^[A-Z]{3}$", description="ISO 4217 code of the prices' currency")
    gpu_hour: float = Field(0.0, ge=0, le=1e6, description="per GPU-hour (one accelerator for one hour)")
    cpu_core_hour: float = Field(0.0, ge=0, le=1e6, description="per CPU-core-hour the processes used")
    node_hour: float = Field(0.0, ge=0, le=1e6, description="per node-hour the step held")


class Usage(BaseModel):
    """What a run used."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_seconds: float = Field(description="the run's wall time")
    gpu_seconds: float = Field(description="accelerators held × wall seconds (0 on CPU)")
    cpu_core_seconds: float = Field(description="CPU time (user + system) of every process the run waited for")
    peak_memory_mb: float = Field(description="the peak resident memory of the largest of its processes")
    nodes: int = Field(1, description="nodes the run held")

    def cost(self, prices: Prices) -> float:
        """The usage at these prices, rounded to a millionth of the currency."""
        return round(
            self.gpu_seconds / 3600 * prices.gpu_hour
            + self.cpu_core_seconds / 3600 * prices.cpu_core_hour
            + self.wall_seconds * self.nodes / 3600 * prices.node_hour,
            6,
        )

    def figures(self, prices: Prices | None) -> dict[str, float]:
        """The figures a run reports (MLflow metrics, Prometheus series): usage, and cost where priced."""
        out = {
            "gpu_seconds": round(self.gpu_seconds, 3),
            "cpu_core_seconds": round(self.cpu_core_seconds, 3),
            "peak_memory_mb": round(self.peak_memory_mb, 1),
        }
        if prices is not None:
            out["cost"] = self.cost(prices)
        return out


class Meter:
    """Measures the processes a step starts and waits for (its ranks), from its making to :meth:`usage`."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._cpu0 = self._children_cpu()

    @staticmethod
    def _children_cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    def elapsed(self) -> float:
        """Wall seconds since the meter started."""
        return time.perf_counter() - self._t0

    def usage(self, gpus: int = 0, nodes: int = 1, wall_seconds: float | None = None) -> Usage:
        """What was used since the meter started: ``gpus`` accelerators held for the wall time."""
        wall = round(time.perf_counter() - self._t0 if wall_seconds is None else wall_seconds, 3)
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: kilobytes
        return Usage(
            wall_seconds=wall,
            gpu_seconds=round(wall * gpus, 3),
            cpu_core_seconds=round(max(self._children_cpu() - self._cpu0, 0.0), 3),
            peak_memory_mb=round(peak_kb / 1024, 1),
            nodes=nodes,
        )


def series(
    usage: Usage, cost: float | None, currency: str | None, labels: dict[str, str]
) -> list[tuple[str, str, dict[str, str], float]]:
    """The Prometheus series of a run's usage and, where it was priced, its cost."""
    out = [
        ("trainpipe_run_gpu_seconds", "accelerators held x wall seconds of the run", labels, usage.gpu_seconds),
        ("trainpipe_run_cpu_core_seconds", "CPU time of the run's processes", labels, usage.cpu_core_seconds),
        (
            "trainpipe_run_peak_memory_bytes",
            "peak resident memory of the run's largest process",
            labels,
            usage.peak_memory_mb * 2**20,
        ),
    ]
    if cost is not None:
        out.append(
            (
                "trainpipe_run_cost",
                "what the run cost at its profile's prices",
                {**labels, "currency": currency or ""},
                cost,
            )
        )
    return out


__all__ = ["Meter", "Prices", "Usage", "series"]
