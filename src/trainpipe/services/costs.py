"""What a run used and what it cost.

A hardware profile may declare :class:`Prices` (per GPU-hour, per CPU-core-hour, per node-hour, in a
named currency). A step measures its :class:`Usage` (wall time, GPU-seconds, CPU-core-seconds of
its processes, their peak memory) with a :class:`Meter`; where the profile is priced, the usage's
cost is reported beside it. The figures are the processes' own (the kernel's accounting of the step's
own process and of every rank it waited for), not the requests of the pod.
"""

from __future__ import annotations

import re
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainpipe.contract import errors, warm
from trainpipe.contract.config import StrictModel


class Prices(StrictModel):
    """What the enterprise's cost model charges for the hardware of a profile."""

    currency: str = Field("USD", description="ISO 4217 code of the prices' currency")
    gpu_hour: float = Field(0.0, ge=0, le=1e6, description="per GPU-hour (one accelerator for one hour)")
    cpu_core_hour: float = Field(0.0, ge=0, le=1e6, description="per CPU-core-hour the processes used")
    node_hour: float = Field(0.0, ge=0, le=1e6, description="per node-hour the step held")

    @field_validator("currency")
    @classmethod
    def _iso_4217(cls, code: str) -> str:
        if re.fullmatch(r"[A-Z]{3}", code) is None:
            raise ValueError(f"{code!r} is not an ISO 4217 code (three capital letters, such as EUR or USD)")
        return code


class Usage(BaseModel):
    """What a run used."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_seconds: float = Field(description="the run's wall time")
    gpu_seconds: float = Field(description="accelerators held × wall seconds (0 on CPU)")
    cpu_core_seconds: float = Field(
        description="CPU time (user + system) of the step's own process (start-up, the MLflow run, logging the "
        "model) and of every process it waited for (its ranks)"
    )
    peak_memory_mb: float = Field(description="the peak resident memory of the largest of its processes")
    nodes: int = Field(1, description="nodes the run held")

    def __add__(self, other: Usage | None) -> Usage:
        if other is None:
            return self
        return Usage(
            wall_seconds=round(self.wall_seconds + other.wall_seconds, 3),
            gpu_seconds=round(self.gpu_seconds + other.gpu_seconds, 3),
            cpu_core_seconds=round(self.cpu_core_seconds + other.cpu_core_seconds, 3),
            peak_memory_mb=max(self.peak_memory_mb, other.peak_memory_mb),
            nodes=max(self.nodes, other.nodes),
        )

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


def _running_below() -> list[Any]:
    """This process's running descendants, and those the steps' warm host forked for it (its ranks) with theirs."""
    import psutil

    found: list[Any] = []
    roots: list[tuple[int, bool]] = [(0, False)] + [(pid, True) for pid in warm.forked_running()]
    for pid, itself in roots:
        try:
            root = psutil.Process(pid or None)
            found += ([root] if itself else []) + root.children(recursive=True)
        except psutil.Error:
            continue
    return found


class Meter:
    """Measures a step: its own process and the processes it starts and waits for (its ranks), from the
    meter's making to :meth:`usage` (its own process's CPU from the process's start with ``whole_process``:
    a step's entrypoint, whose start-up is the step's too).
    """

    def __init__(self, whole_process: bool = False) -> None:
        self._t0 = time.perf_counter()
        self._cpu0 = self._children_cpu()
        self._own0 = 0.0 if whole_process else self._own_cpu()

    @staticmethod
    def _children_cpu() -> float:
        """Every child's that ended, the ranks the steps' warm host forked for this process included."""
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime + warm.forked_ended()[0]

    @staticmethod
    def _own_cpu() -> float:
        """This process's CPU time, every thread's (the MLflow run opened beside the ranks included)."""
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    def elapsed(self) -> float:
        """Wall seconds since the meter started."""
        return time.perf_counter() - self._t0

    def live(self, gpus: int = 0, nodes: int = 1) -> Usage:
        """What was used so far, the processes still running included (psutil reads their CPU time)."""
        import psutil

        running = 0.0
        for proc in _running_below():
            try:
                t = proc.cpu_times()
                running += t.user + t.system
            except psutil.Error:
                continue
        done = self.usage(gpus, nodes)
        return done.model_copy(update={"cpu_core_seconds": round(done.cpu_core_seconds + running, 3)})

    def usage(self, gpus: int = 0, nodes: int = 1, wall_seconds: float | None = None) -> Usage:
        """What was used since the meter started: ``gpus`` accelerators held for the wall time."""
        wall = round(time.perf_counter() - self._t0 if wall_seconds is None else wall_seconds, 3)
        peak_kb = max(  # Linux: kilobytes
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            warm.forked_ended()[1],
        )
        cpu = max(self._children_cpu() - self._cpu0, 0.0) + max(self._own_cpu() - self._own0, 0.0)
        return Usage(
            wall_seconds=wall,
            gpu_seconds=round(wall * gpus, 3),
            cpu_core_seconds=round(cpu, 3),
            peak_memory_mb=round(peak_kb / 1024, 1),
            nodes=nodes,
        )


#: What every attempt of a training has used, kept beside its checkpoints: a budget counts them all.
SPENT_FILE = "spent.json"


def spent_before(checkpoint_dir: str | Path) -> Usage | None:
    """What earlier attempts of this training used (their checkpoints' record), or None."""
    try:
        return Usage.model_validate_json((Path(checkpoint_dir) / SPENT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def record_spent(checkpoint_dir: str | Path, usage: Usage) -> None:
    """Keep what every attempt so far used beside the checkpoints (atomically)."""
    from trainpipe.contract.io import atomic_write_text

    atomic_write_text(Path(checkpoint_dir) / SPENT_FILE, usage.model_dump_json())


@dataclass(frozen=True)
class Budget:
    """A limit on what a training may spend: a cost at the profile's prices, GPU-hours, or both."""

    max_cost: float | None
    max_gpu_hours: float | None
    prices: Prices | None

    def reached(self, spent: Usage) -> str | None:
        """What was spent against which limit, when a limit is reached; else None."""
        if self.max_cost is not None and self.prices is not None:
            cost = spent.cost(self.prices)
            if cost >= self.max_cost:
                cur = self.prices.currency
                return (
                    f"max_cost: spent {cost:.4f} {cur} of {self.max_cost:g} {cur} ({spent.gpu_seconds:.0f} "
                    f"GPU-seconds, {spent.cpu_core_seconds:.0f} CPU-core-seconds, {spent.wall_seconds:.0f} s over "
                    "every attempt)"
                )
        if self.max_gpu_hours is not None and spent.gpu_seconds / 3600 >= self.max_gpu_hours:
            return (
                f"max_gpu_hours: spent {spent.gpu_seconds / 3600:.4f} GPU-hours of {self.max_gpu_hours:g} "
                f"({spent.wall_seconds:.0f} s over every attempt)"
            )
        return None


#: Which rerun resumes: a pipeline engine gives each run its own output folder (a new run starts over there).
SAME = " (on the same checkpoints: the same output_dir, or a checkpoint_dir the runs share)"


class Spending:
    """What a training spends, against its budget: every earlier attempt (the record beside its
    checkpoints) and this one: its ranks, measured while they run, and this process's own CPU (its
    start-up, the MLflow run opened beside the ranks, logging the model after them).

    Args:
        checkpoints: The training's checkpoint folder, where every attempt's spending is kept.
        prices: The hardware profile's prices (None: unpriced).
        profile: The profile's name (for the refusal of a cost budget on an unpriced profile).
        max_cost: The cost budget at those prices, or None.
        max_gpu_hours: The GPU-hours budget, or None.
        gpus: The accelerators the ranks hold (0 on CPU).

    Raises:
        InputError: max_cost on a hardware profile without prices.
        BudgetReached: earlier attempts already spent the budget (nothing starts).
    """

    def __init__(
        self,
        checkpoints: Path,
        prices: Prices | None,
        *,
        profile: str,
        max_cost: float | None = None,
        max_gpu_hours: float | None = None,
        gpus: int = 0,
    ) -> None:
        self.prices = prices
        if max_cost is not None and prices is None:
            raise errors.InputError(
                f"max_cost: the hardware profile {profile!r} declares no prices (give it prices:, or set max_gpu_hours)"
            )
        self.dir = Path(checkpoints)
        self.before = spent_before(self.dir)
        limited = max_cost is not None or max_gpu_hours is not None
        self.budget = Budget(max_cost, max_gpu_hours, prices) if limited else None
        self.gpus = gpus
        self.reason: str | None = None
        self.training_wall: float | None = None
        if self.budget is not None and self.before is not None and (said := self.budget.reached(self.before)):
            raise errors.BudgetReached(f"{said}; nothing started: a rerun with a larger budget resumes{SAME}")
        self.meter = Meter()

    def start(self) -> None:
        """The ranks start now: this attempt's wall time is measured from here (its own CPU from its start)."""
        self.meter = Meter(whole_process=True)
        self.training_wall = None

    def spent(self) -> bool:
        """Whether the budget is spent (the launcher asks once a second)."""
        assert self.budget is not None
        self.reason = self.budget.reached(self.meter.live(self.gpus) + self.before)
        return self.reason is not None

    def record(self) -> None:
        """What this attempt used so far (``this``) and every attempt so far (``total``, kept beside the
        checkpoints). The first record, as the ranks end, also fixes the training's wall time."""
        self.this = self.meter.usage(self.gpus)
        self.total = self.this + self.before
        if self.training_wall is None:
            self.training_wall = self.this.wall_seconds
        record_spent(self.dir, self.total)


def where_stopped(err: dict[str, Any] | None) -> str:
    """Where a budget's stop left the training, from the ranks' record of it (the step, the checkpoint)."""
    step, ckpt = (err or {}).get("step"), (err or {}).get("checkpoint")
    if ckpt:
        return f"stopped at step {step} with a checkpoint: a rerun with a larger budget resumes from {ckpt}{SAME}"
    if err is None:  # the ranks were stopped before they could say where
        return f"stopped: a rerun with a larger budget resumes from the newest checkpoint, if one was written{SAME}"
    return f"stopped at step {step or 0}: no checkpoint was written, so a rerun with a larger budget starts over"


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


__all__ = ["Budget", "Meter", "Prices", "Spending", "Usage", "record_spent", "series", "spent_before", "where_stopped"]
