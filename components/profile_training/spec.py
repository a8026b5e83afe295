"""profile_training: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT

NAME = "profile_training"
REPORT_FILE = "report.html"
SUMMARY_FILE = "summary.json"


class ProfileTrainingParams(StrictModel):
    """Settings of profile_training that are not artifacts."""

    warmup_steps: int = Field(3, ge=0, le=1_000_000, description="first steps of each rank left out of steady state")


class ProfileTrainingConfig(ProfileTrainingParams):
    """Everything profile_training needs, artifacts included."""

    model: str = Field(..., min_length=1, description="the training run's model artifact (train_model's output)", json_schema_extra=INPUT)
    output_dir: str = Field(..., min_length=1, description="where the report and summary go", json_schema_extra=OUTPUT)


class ProfileTrainingResult(BaseModel):
    """What profile_training reports."""

    world_size: int
    steps: int = Field(description="steady-state steps measured, all ranks")
    samples_per_second: float = Field(description="steady-state throughput of the whole job")
    step_time_ms: dict[str, float] = Field(description="mean, p50, p95 of steady-state step time")
    breakdown_ms: dict[str, float] = Field(description="mean per-step time in data, forward, backward, optimizer")
    rank_skew: float = Field(description="slowest rank's mean step time over the fastest's")
    peak_rss_mb: dict[str, float]
    peak_device_mb: dict[str, float | None]
    threads_per_rank: int
    report: str = REPORT_FILE
    lineage: dict[str, Any] = Field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"{self.samples_per_second:,.0f} samples/s over {self.world_size} ranks, "
            f"step {self.step_time_ms['mean']:.2f} ms (p95 {self.step_time_ms['p95']:.2f})"
        )
