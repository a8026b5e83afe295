"""evaluate_model: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT, SOURCE
from trainpipe.contract.result import ComponentResult
from trainpipe.contract.runtime import TrustedPackages
from trainpipe.data.scoring import LOWER_IS_BETTER
from trainpipe.services.registry import ALIAS_PATTERN, DEFAULT_ALIAS

NAME = "evaluate_model"
METRICS_FILE = "metrics.json"
REPORT_FILE = "report.html"
#: Metrics evaluate_model computes, by task, and which way is better.
CLASSIFICATION_METRICS = ("accuracy", "f1_macro", "precision_macro", "recall_macro", "roc_auc", "log_loss")
REGRESSION_METRICS = ("mae", "rmse", "r2")
METRICS = CLASSIFICATION_METRICS + REGRESSION_METRICS
TASK_METRICS = {"classification": CLASSIFICATION_METRICS, "regression": REGRESSION_METRICS}
DEFAULT_THRESHOLDS = {"classification": {"accuracy": 0.8}, "regression": {"r2": 0.0}}
DEFAULT_MAX_REGRESSION = {"classification": {"accuracy": 0.0}, "regression": {"rmse": 0.0}}


class EvaluateModelParams(StrictModel):
    """Settings of evaluate_model that are not artifacts."""

    label_column: str = Field("label", min_length=1, description="name of the label column")
    thresholds: dict[str, float] | None = Field(
        None,
        description="per metric: the minimum (higher-is-better metrics) or maximum (log_loss, mae, rmse, yours listed "
        "lower-is-better) to pass; "
        "default: accuracy 0.8 for a classifier, r2 0.0 for a regressor",
    )
    model_name: str | None = Field(
        None, description="registered model whose champion the model is compared with (none: thresholds only)"
    )
    alias: str = Field(
        DEFAULT_ALIAS,
        pattern=ALIAS_PATTERN,
        description="the serving alias: the model is compared with the version under it (register_model moves the same "
        "alias)",
    )
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    min_improvement: dict[str, float] = Field(
        default_factory=dict, description="per metric: how much better than the champion the model must be"
    )
    max_regression: dict[str, float] | None = Field(
        None,
        description="per metric: how much worse than the champion the model may be; default: accuracy 0.0 "
        "(classifier), rmse 0.0 (regressor)",
    )
    tie_tolerance: float = Field(
        0.0,
        ge=0,
        description="how much better than the champion a compared metric must be to count as better; a model better "
        "on no compared metric (a tie) passes the gate but keeps the champion",
    )
    fail_on_gate: bool = Field(False, description="exit 4 when the gate does not pass (default: report it as data)")

    metric_functions: dict[str, str] = Field(
        default_factory=dict,
        description="your own metrics: name -> 'package.module:function' called as f(y_true, y_pred) -> float (labels "
        "or values)",
    )
    lower_is_better: list[str] = Field(
        default_factory=list, description="which of your metrics are better when lower (an error, a cost)"
    )
    trusted_packages: TrustedPackages

    @model_validator(mode="after")
    def _known(self) -> EvaluateModelParams:
        known = set(METRICS) | set(self.metric_functions)
        for field in ("thresholds", "min_improvement", "max_regression"):
            unknown = sorted(set(getattr(self, field) or {}) - known)
            if unknown:
                raise ValueError(f"{field}: unknown metric {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        clash = sorted(set(self.metric_functions) & set(METRICS))
        if clash:
            raise ValueError(f"metric_functions: {', '.join(clash)} is a built-in metric name; name yours differently")
        for name, ref in self.metric_functions.items():
            module, sep, func = ref.partition(":")
            if not sep or not all(p.isidentifier() for p in module.split(".")) or not func.isidentifier():
                raise ValueError(f"metric_functions: {name}: {ref!r} is not 'package.module:function'")
        stray = sorted(set(self.lower_is_better) - set(self.metric_functions))
        if stray:
            raise ValueError(f"lower_is_better: {', '.join(stray)} is not one of your metric_functions")
        return self

    def gate_rules(self, task: str) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """``(thresholds, min_improvement, max_regression)`` for a model of ``task``: the defaults
        filled in, and metrics of the other task refused.

        Raises:
            InputError: a rule names a metric this task does not have.
        """
        from trainpipe.contract.errors import InputError

        thresholds = self.thresholds if self.thresholds is not None else DEFAULT_THRESHOLDS[task]
        max_regression = self.max_regression if self.max_regression is not None else DEFAULT_MAX_REGRESSION[task]
        other = set(REGRESSION_METRICS if task == "classification" else CLASSIFICATION_METRICS)
        for field, rules in (
            ("thresholds", thresholds),
            ("min_improvement", self.min_improvement),
            ("max_regression", max_regression),
        ):
            wrong = sorted(set(rules) & other)
            if wrong:
                raise InputError(
                    f"{field}: {', '.join(wrong)} is not a metric of a {task} model (it has "
                    f"{', '.join(TASK_METRICS[task])} and your metric_functions)"
                )
        return dict(thresholds), dict(self.min_improvement), dict(max_regression)

    def lower_better(self) -> frozenset[str]:
        """Every metric that is better when lower: the built-in errors and the listed team metrics."""
        return LOWER_IS_BETTER | frozenset(self.lower_is_better)


class EvaluateModelConfig(EvaluateModelParams):
    """Everything evaluate_model needs, artifacts included."""

    model: str = Field(
        ..., min_length=1, description="the model artifact (train_model's output)", json_schema_extra=INPUT
    )
    data: str = Field(
        ..., min_length=1, description="the same dataset snapshot the model was trained on", json_schema_extra=SOURCE
    )
    output_dir: str = Field(
        ..., min_length=1, description="where metrics, the decision and the report go", json_schema_extra=OUTPUT
    )


class GateDecision(BaseModel):
    """The gate, as data: the next step (and a person) reads why."""

    passed: bool
    reasons: list[str] = Field(description="every threshold and comparison, passed or not")
    failures: list[str] = Field(default_factory=list, description="the reasons that failed the gate")
    thresholds: dict[str, float]
    metrics: dict[str, float]
    champion: dict[str, Any] | None = Field(
        None, description="the champion compared with: version, run, metrics on this snapshot"
    )
    compared_with_champion: bool = False
    beats_champion: bool = Field(
        False, description="passed, and strictly better than a current champion (a tie keeps the champion)"
    )
    rules: dict[str, Any] = Field(
        default_factory=dict,
        description="the comparison rules (min_improvement, max_regression, tie_tolerance, lower_is_better): "
        "register_model compares with them again when the alias moved since",
    )
    model_name: str | None = Field(None, description="the registered model whose serving alias was looked up")
    alias: str | None = Field(
        None, description="the serving alias whose version was compared: register_model moves this alias only"
    )


class EvaluateModelResult(ComponentResult):
    """What evaluate_model reports."""

    task: str = Field("classification", description="classification or regression")
    metrics: dict[str, float] = Field(description="the model's metrics on the held-out rows")
    lower_is_better: list[str] = Field(default_factory=list, description="the metrics here that are better when lower")
    per_class: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="precision, recall, f1, support per class"
    )
    confusion_matrix: list[list[int]] = Field(default_factory=list, description="classification only")
    roc_curve: dict[str, list[float]] = Field(
        default_factory=dict, description="micro-averaged fpr, tpr, thresholds (classification)"
    )
    residuals: dict[str, float] = Field(
        default_factory=dict, description="regression: mean, std and largest absolute residual"
    )
    classes: list[Any] = Field(default_factory=list, description="the class labels (classification)")
    n_test: int = Field(description="held-out rows scored")
    decision: GateDecision = Field(description="the gate's decision: passed, reasons, the champion compared")

    def audit_events(self) -> list[dict[str, Any]]:
        """The gate decision, as a record of the audit trail."""
        d = self.decision
        champion = (d.champion or {}).get("version")
        return [
            {
                "action": "gate",
                "decision": {
                    "passed": d.passed,
                    "failures": d.failures,
                    "thresholds": d.thresholds,
                    "metrics": d.metrics,
                    "champion_version": champion,
                    "beats_champion": d.beats_champion,
                },
            }
        ]

    def figures(self) -> dict[str, float]:
        return {"rows": float(self.n_test)}

    def summary(self) -> str:
        m = ", ".join(f"{k} {v:.4f}" for k, v in self.metrics.items())
        return f"{m} on {self.n_test} held-out rows; gate {'passed' if self.decision.passed else 'NOT passed'}"
