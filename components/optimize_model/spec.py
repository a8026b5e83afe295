"""optimize_model: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT, SOURCE
from trainpipe.contract.result import ComponentResult
from trainpipe.contract.runtime import TrustedPackages

NAME = "optimize_model"
REPORT_FILE = "report.html"
#: The accepted variant's folder inside the output: ``model.onnx`` + ``model.json`` + the examples.
#: The format ``model.json`` of an optimized model says it is (the ONNX pyfunc checks it).
ONNX_FORMAT = "trainpipe-onnx/1"
#: Every variant optimize_model can make, in the order it makes them. ``fp32`` (torch eager, the
#: reference every other is measured against) is always measured and never the one handed on.
VARIANTS = ("onnx", "int8_dynamic", "int8_static", "pruned")
#: The metric each task is gated on unless ``metric`` says otherwise, and the ones that are better lower.
DEFAULT_METRIC = {"classification": "accuracy", "regression": "r2"}
METRICS = {"classification": ("accuracy", "f1_macro"), "regression": ("r2", "rmse", "mae")}
LOWER_IS_BETTER = frozenset({"rmse", "mae"})


class OptimizeModelParams(StrictModel):
    """Settings of optimize_model that are not artifacts."""

    label_column: str = Field("label", min_length=1, description="name of the label column")
    variants: list[Literal["onnx", "int8_dynamic", "int8_static", "pruned"]] | None = Field(
        None,
        min_length=1,
        description="what to make: onnx (fp32 ONNX, ONNX Runtime with graph optimizations), int8_dynamic (int8 "
        "weights, "
        "activations quantized at run time), int8_static (int8 weights and activations, calibrated on training rows), "
        "pruned (sparsity applied, fine-tuned when the metric dropped too far, then exported); default: every one the "
        "model allows (pruned is skipped, with the reason, for a model with no Linear or Conv layer to prune); a "
        "variant "
        "named here that the model does not allow fails the step",
    )
    metric: str | None = Field(
        None,
        description="the metric the gate compares: accuracy, f1_macro (classification); r2, rmse, mae "
        "(regression); default accuracy or r2",
    )
    max_metric_drop: float = Field(
        0.005,
        ge=0,
        le=1,
        description="a variant is accepted only when its metric is at most this much "
        "worse than the fp32 model's on the same held-out rows (0.005: half a point of accuracy)",
    )
    sparsity: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="the share of weights (unstructured) or of units (structured) pruned in every "
        "Linear and Conv layer but the last",
    )
    pruning: Literal["unstructured", "structured"] = Field(
        "unstructured",
        description="unstructured: the smallest weights; structured: whole units (rows of a Linear, filters of a Conv) "
        "by L2 norm",
    )
    fine_tune_epochs: int = Field(
        2,
        ge=0,
        le=100,
        description="epochs of fine-tuning (pruned weights held at zero) when pruning cost more "
        "than max_metric_drop; 0: never",
    )
    calibration_rows: int = Field(
        512, ge=1, le=1_000_000, description="training rows that calibrate int8_static (and the rows timed)"
    )
    onnx_atol: float = Field(
        1e-3,
        gt=0,
        description="largest absolute difference allowed between the ONNX model's outputs and torch's "
        "on the held-out rows",
    )
    select: Literal["throughput", "latency", "size"] = Field(
        "throughput",
        description="which accepted variant is handed on: the highest throughput at batch 256, the lowest p50 latency "
        "at "
        "batch 1, or the smallest file",
    )
    threads: int = Field(
        1,
        ge=1,
        le=256,
        description="intra-op threads of torch and ONNX Runtime while timing (recorded with the figures)",
    )
    latency_runs: int = Field(
        200, ge=10, le=100_000, description="batch-1 calls timed per variant (p50 and p99 of these)"
    )
    seed: int = Field(0, ge=0, description="seed of the calibration sample and the fine-tuning")
    trusted_packages: TrustedPackages

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str | None) -> str | None:
        known = sorted({m for ms in METRICS.values() for m in ms})
        if value is not None and value not in known:
            raise ValueError(f"{value!r} is not one of {', '.join(known)}")
        return value


class OptimizeModelConfig(OptimizeModelParams):
    """Everything optimize_model needs, artifacts included."""

    model: str = Field(
        ..., min_length=1, description="the model artifact (train_model's output)", json_schema_extra=INPUT
    )
    data: str = Field(
        ...,
        min_length=1,
        description="the snapshot the model was trained on: its held-out rows score every variant, "
        "its training rows calibrate and fine-tune",
        json_schema_extra=SOURCE,
    )
    calibration_data: str | None = Field(
        None,
        description="rows to calibrate int8_static on instead of the training rows (the same columns)",
        json_schema_extra=SOURCE,
    )
    output_dir: str = Field(
        ...,
        min_length=1,
        description="where optimization.json, report.html and the accepted model go",
        json_schema_extra=OUTPUT,
    )


class Variant(BaseModel):
    """One variant, measured on this CPU in this run."""

    name: str
    metric: float
    metric_drop: float = Field(description="how much worse than fp32 (positive: worse), in the metric's direction")
    metrics: dict[str, float]
    size_bytes: int
    size_ratio: float = Field(description="size over the fp32 model's")
    compressed_bytes: int = Field(description="the file gzipped: what sparsity saves in storage and transfer")
    latency_p50_ms: float = Field(description="batch 1")
    latency_p99_ms: float
    throughput_rows_s: float = Field(description="rows a second at batch 256")
    speedup_b1: float = Field(description="fp32 torch eager's p50 latency over this one's")
    speedup_b256: float = Field(description="this one's throughput over fp32 torch eager's")
    accepted: bool
    reason: str
    max_abs_diff: float | None = Field(
        None, description="largest difference from torch's outputs on the held-out rows (ONNX fp32 variants)"
    )
    sparsity: float | None = Field(None, description="share of the prunable weights that are zero")
    fine_tuned_epochs: int = 0
    metric_before_fine_tune: float | None = Field(
        None, description="the pruned model's metric before its fine-tune (when it had one)"
    )


def _times(ratio: float, better: str, worse: str) -> str:
    """A ratio a person reads the right way round: ``2.22x faster``, ``2.22x larger`` (never ``0.45x``)."""
    if abs(ratio - 1) < 0.005:
        return f"no {better} or {worse}"
    return f"{ratio:.2f}x {better}" if ratio > 1 else f"{1 / ratio:.2f}x {worse}"


class OptimizeModelResult(ComponentResult):
    """What optimize_model reports: every variant's figures, and the one handed on (or why none)."""

    task: str = Field(description="classification or regression")
    metric: str = Field(description="the metric the variants are compared on")
    max_metric_drop: float = Field(description="the largest drop in that metric a variant may have")
    n_test: int = Field(description="held-out rows scored")
    calibration_rows: int = Field(description="rows used to calibrate int8")
    threads: int = Field(description="CPU threads each variant was timed with")
    cpu: str = Field(description="the CPU timed on")
    onnxruntime: str = Field(description="the ONNX Runtime version")
    variants: list[Variant] = Field(description="each variant: its metric, latency and size")
    selected: str | None = Field(
        description="the accepted variant written to the output, or None when none was accepted"
    )
    reason: str = Field(description="why the accepted variant was chosen, or none")
    skipped: dict[str, str] = Field(
        default_factory=dict, description="default variants not made for this model, and why"
    )
    model_sha256: str | None = Field(None, description="sha256 of the selected variant's model.onnx")

    def summary(self) -> str:
        if self.selected is None:
            return f"no variant accepted: {self.reason}"
        v = next(x for x in self.variants if x.name == self.selected)
        return (
            f"{self.selected}: {self.metric} {v.metric:.4f} (drop {v.metric_drop:+.4f}), "
            f"{_times(v.speedup_b256, 'faster', 'slower')} at batch 256, {_times(v.speedup_b1, 'faster', 'slower')} at "
            f"batch 1, {_times(1 / v.size_ratio if v.size_ratio else 1.0, 'smaller', 'larger')} than fp32"
        )

    def figures(self) -> dict[str, float]:
        return {"rows": float(self.n_test)}

    def series(self) -> list[tuple[str, str, dict[str, str], float]]:
        out: list[tuple[str, str, dict[str, str], float]] = []
        for v in self.variants:
            labels = {"variant": v.name}
            out.append(
                ("trainpipe_optimize_metric", f"per variant: {self.metric} on the held-out rows", labels, v.metric)
            )
            out.append(
                (
                    "trainpipe_optimize_latency_p50_seconds",
                    "per variant: p50 latency at batch 1",
                    labels,
                    v.latency_p50_ms / 1000,
                )
            )
            out.append(
                (
                    "trainpipe_optimize_throughput_rows_per_second",
                    "per variant: rows a second at batch 256",
                    labels,
                    v.throughput_rows_s,
                )
            )
            out.append(("trainpipe_optimize_size_bytes", "per variant: model file size", labels, float(v.size_bytes)))
            out.append(
                ("trainpipe_optimize_accepted", "per variant: 1 if within max_metric_drop", labels, float(v.accepted))
            )
        return out

    def audit_events(self) -> list[dict[str, Any]]:
        return [
            {
                "action": "optimization",
                "decision": {
                    "selected": self.selected,
                    "reason": self.reason,
                    "metric": self.metric,
                    "accepted": [v.name for v in self.variants if v.accepted and v.name != "fp32"],
                    "model_sha256": self.model_sha256,
                },
            }
        ]
