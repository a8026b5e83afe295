"""profile_training: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT
from trainpipe.contract.result import ComponentResult

NAME = "profile_training"
REPORT_FILE = "report.html"
SUMMARY_FILE = "summary.json"
TRACE_FILE = "trace.json"


class ProfileTrainingParams(StrictModel):
    """Settings of profile_training that are not artifacts."""

    warmup_steps: int = Field(3, ge=0, le=1_000_000, description="first steps of each rank left out of steady state")
    peak_tflops: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="the device's peak TFLOP/s for MFU (default: from the table of known devices)",
    )
    profile_steps: int = Field(20, ge=1, le=10_000, description="profiling pass only: steps traced with torch.profiler")
    train: dict[str, Any] = Field(
        default_factory=dict, description="profiling pass only: train_model settings (backend, model, batch_size, ...)"
    )
    tracking_uri: str | None = Field(None, description="MLflow tracking URI; the summary is logged to the training run")


class ProfileTrainingConfig(ProfileTrainingParams):
    """Everything profile_training needs, artifacts included."""

    model: str | None = Field(
        None, description="the training run's model artifact (train_model's output)", json_schema_extra=INPUT
    )
    data: str | None = Field(
        None,
        description="a dataset snapshot: run a short profiling pass on it instead of reading a finished run",
        json_schema_extra=INPUT,
    )

    @model_validator(mode="after")
    def _one_source(self) -> ProfileTrainingConfig:
        if (self.model is None) == (self.data is None):
            raise ValueError(
                "model, data: give exactly one: a training run's model (profile it) or a snapshot (profiling pass)"
            )
        return self

    output_dir: str = Field(..., min_length=1, description="where the report and summary go", json_schema_extra=OUTPUT)


class ProfileTrainingResult(ComponentResult):
    """What profile_training reports."""

    world_size: int = Field(description="ranks profiled")
    steps: int = Field(description="steady-state steps measured, all ranks")
    samples_per_second: float = Field(description="steady-state throughput of the whole job")
    step_time_ms: dict[str, float] = Field(description="mean, p50, p95 of steady-state step time")
    breakdown_ms: dict[str, float] = Field(description="mean per-step time in data, forward, backward, optimizer")
    rank_skew: float = Field(description="slowest rank's mean step time over the fastest's")
    peak_rss_mb: dict[str, float] = Field(description="each rank's peak host memory (MB)")
    peak_device_mb: dict[str, float | None] = Field(description="each rank's peak device memory (MB; null on CPU)")
    threads_per_rank: int = Field(description="CPU threads each rank used")
    cpu_utilization: float = Field(description="CPU time over wall time per rank, as a share of its threads")
    device: str = Field("", description="the device profiled")
    flops_per_sample: float | None = Field(None, description="training FLOPs per sample (forward + backward)")
    achieved_tflops: float | None = Field(
        None, description="model FLOPs per second achieved (TFLOPS), where the FLOPs are counted"
    )
    peak_tflops: float | None = Field(None, description="the device's peak (TFLOPS), where known")
    peak_source: str = Field("", description="where the peak figure comes from")
    mfu: float | None = Field(None, description="model FLOPs utilization: achieved over peak")
    gpu_utilization_pct: dict[str, float | None] | None = Field(
        None, description="NVML utilization per rank (CUDA only)"
    )
    collective_ms_per_step: float | None = Field(
        None, description="time in collectives per step (torch.profiler), overlapping backward"
    )
    profiled_window: dict[str, Any] | None = Field(
        None, description="the traced steps and their throughput from the telemetry"
    )
    cost: float | None = Field(None, description="what the profiled training cost (its hardware profile's prices)")
    currency: str | None = Field(None, description="the cost's currency")
    cost_per_epoch: float | None = Field(None, description="the training's cost over its epochs")
    cost_per_1k_samples: float | None = Field(
        None, description="what a thousand samples cost at the steady-state throughput and the run's cost per second"
    )
    recommendations: list[str] = Field(
        default_factory=list, description="what would make the step faster, most useful first"
    )
    trace: str | None = Field(None, description="Chrome trace file (chrome://tracing, Perfetto)")
    mlflow_run_id: str | None = Field(None, description="the MLflow run the profile was logged to")
    report: str = Field(REPORT_FILE, description="the HTML report, relative to output_dir")

    def series(self) -> list[tuple[str, str, dict[str, str], float]]:
        """What the profiled training cost per epoch and per thousand samples (Prometheus), where it was priced."""
        labels = {"currency": self.currency or ""}
        return [
            (f"trainpipe_profile_{name}", doc, labels, value)
            for name, doc, value in (
                ("cost_per_epoch", "the profiled training's cost per epoch", self.cost_per_epoch),
                ("cost_per_1k_samples", "what 1,000 samples cost at its throughput", self.cost_per_1k_samples),
            )
            if value is not None
        ]

    def summary(self) -> str:
        cost = (
            f", {self.cost_per_1k_samples:.6f} {self.currency} per 1,000 samples"
            if self.cost_per_1k_samples is not None
            else ""
        )
        return (
            f"{self.samples_per_second:,.0f} samples/s over {self.world_size} ranks, "
            f"step {self.step_time_ms['mean']:.2f} ms (p95 {self.step_time_ms['p95']:.2f}){cost}"
        )
