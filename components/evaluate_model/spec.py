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
#: Metrics evaluate_model computes, by task, and which way is better.
CLASSIFICATION_METRICS = ("accuracy", "f1_macro", "precision_macro", "recall_macro", "roc_auc", "log_loss")
REGRESSION_METRICS = ("mae", "rmse", "r2")
METRICS = CLASSIFICATION_METRICS + REGRESSION_METRICS
LOWER_IS_BETTER = frozenset({"log_loss", "mae", "rmse"})


class EvaluateModelParams(StrictModel):
    """Settings of evaluate_model that are not artifacts."""

    label_column: str = Field("label", min_length=1, description="name of the label column")
    thresholds: dict[str, float] = Field(
        default_factory=lambda: {"accuracy": 0.8},
        description="per metric: the minimum (higher-is-better metrics) or maximum (log_loss, mae, rmse) to pass",
    )
    model_name: str | None = Field(None, description="registered model whose champion the model is compared with (none: thresholds only)")
    champion_alias: str = Field("champion", pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,254}$")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    min_improvement: dict[str, float] = Field(
        default_factory=dict, description="per metric: how much better than the champion the model must be"
    )
    max_regression: dict[str, float] = Field(
        default_factory=lambda: {"accuracy": 0.0}, description="per metric: how much worse than the champion the model may be"
    )
    fail_on_gate: bool = Field(False, description="exit 4 when the gate does not pass (default: report it as data)")

    @field_validator("thresholds", "min_improvement", "max_regression")
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
    reasons: list[str] = Field(description="every threshold and comparison, passed or not")
    failures: list[str] = Field(default_factory=list, description="the reasons that failed the gate")
    thresholds: dict[str, float]
    metrics: dict[str, float]
    champion: dict[str, Any] | None = Field(None, description="the champion compared with: version, run, metrics on this snapshot")
    compared_with_champion: bool = False
    beats_champion: bool = Field(False, description="passed, and decided against a current champion")


class EvaluateModelResult(BaseModel):
    """What evaluate_model reports."""

    task: str = "classification"
    metrics: dict[str, float]
    per_class: dict[str, dict[str, float]] = Field(default_factory=dict, description="precision, recall, f1, support per class")
    confusion_matrix: list[list[int]]
    roc_curve: dict[str, list[float]] = Field(default_factory=dict, description="micro-averaged fpr, tpr, thresholds")
    classes: list[Any]
    n_test: int
    decision: GateDecision
    lineage: dict[str, Any] = Field(default_factory=dict)

    def audit_events(self) -> list[dict[str, Any]]:
        """The gate decision, as a record of the audit trail."""
        d = self.decision
        champion = (d.champion or {}).get("version")
        return [{"action": "gate", "decision": {"passed": d.passed, "failures": d.failures, "thresholds": d.thresholds,
                                                "metrics": d.metrics, "champion_version": champion, "beats_champion": d.beats_champion}}]

    def summary(self) -> str:
        m = ", ".join(f"{k} {v:.4f}" for k, v in self.metrics.items())
        return f"{m} on {self.n_test} held-out rows; gate {'passed' if self.decision.passed else 'NOT passed'}"
