"""evaluate_model: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT

NAME = "evaluate_model"
DECISION_FILE = "decision.json"
METRICS_FILE = "metrics.json"
REPORT_FILE = "report.html"
#: Metrics evaluate_model computes; thresholds may name any of them (higher is better).
METRICS = ("accuracy", "f1_macro", "precision_macro", "recall_macro")


class EvaluateModelParams(StrictModel):
    """Settings of evaluate_model that are not artifacts."""

    label_column: str = Field("label", min_length=1, description="name of the label column")
    thresholds: dict[str, float] = Field(
        default_factory=lambda: {"accuracy": 0.8}, description="minimum value per metric for the gate to pass"
    )
    fail_on_gate: bool = Field(False, description="exit 4 when the gate does not pass (default: report it as data)")

    @field_validator("thresholds")
    @classmethod
    def _known(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(METRICS))
        if unknown:
            raise ValueError(f"unknown metric {', '.join(unknown)} (known: {', '.join(METRICS)})")
        return v


class EvaluateModelConfig(EvaluateModelParams):
    """Everything evaluate_model needs, artifacts included."""

    model: str = Field(..., min_length=1, description="the model artifact (train_model's output)", json_schema_extra=INPUT)
    data: str = Field(..., min_length=1, description="the same dataset snapshot the model was trained on", json_schema_extra=INPUT)
    output_dir: str = Field(..., min_length=1, description="where metrics, the decision and the report go", json_schema_extra=OUTPUT)


class GateDecision(BaseModel):
    """The gate, as data: the next step (and a person) reads why."""

    passed: bool
    reasons: list[str]
    thresholds: dict[str, float]
    metrics: dict[str, float]
    champion: dict[str, Any] | None = None


class EvaluateModelResult(BaseModel):
    """What evaluate_model reports."""

    metrics: dict[str, float]
    confusion_matrix: list[list[int]]
    classes: list[Any]
    n_test: int
    decision: GateDecision
    lineage: dict[str, Any] = Field(default_factory=dict)

    def summary(self) -> str:
        m = ", ".join(f"{k} {v:.4f}" for k, v in self.metrics.items())
        return f"{m} on {self.n_test} held-out rows; gate {'passed' if self.decision.passed else 'NOT passed'}"
