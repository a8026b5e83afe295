"""detect_drift: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import OUTPUT, SOURCE
from trainpipe.contract.result import ComponentResult
from trainpipe.contract.runtime import TrustedPackages

#: One column's figures, as the statistics engine computes them (stdlib only at import): the method, its
#: figure (a p-value for a test, a distance for a distance), the threshold, the verdict.
from trainpipe.data.drift import ColumnDrift as ColumnResult
from trainpipe.services.registry import ALIAS_PATTERN, DEFAULT_ALIAS

NAME = "detect_drift"
RESULT_FILE = "drift.json"
REPORT_FILE = "report.html"
#: What a per-column method override may name (trainpipe.data.drift.METHODS; kept here so the spec imports nothing).
METHOD_NAMES = ("ks", "wasserstein", "psi", "chisquare", "jensenshannon")


class DetectDriftParams(StrictModel):
    """Settings of detect_drift that are not artifacts."""

    label_column: str = Field(
        "label",
        min_length=1,
        description="name of the label column (its drift is reported and counts like a feature's)",
    )
    model_name: str | None = Field(
        None,
        description="registered model whose champion's training snapshot is the reference (through its lineage, from "
        "its DVC remote)",
    )
    alias: str = Field(
        DEFAULT_ALIAS,
        pattern=ALIAS_PATTERN,
        description="the serving alias: drift is measured against the training data of the version under it",
    )
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    categorical_columns: list[str] = Field(
        default_factory=list, description="numeric columns to compare as categories (strings and booleans always are)"
    )
    drift_share: float = Field(
        0.5, gt=0, le=1, description="the data set drifted when at least this share of its columns drifted"
    )
    column_methods: dict[str, str] = Field(
        default_factory=dict,
        description="per column: ks, wasserstein, psi (numeric), chisquare, jensenshannon (categorical); "
        "default KS / chi-squared up to 1,000 reference rows, normed Wasserstein / Jensen-Shannon past that",
    )
    column_thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="per column: the p-value under which a test, or the distance from which a distance, says drift "
        "(default 0.05 for the tests, 0.1 for the distances)",
    )
    sample_size: int = Field(
        100_000,
        ge=100,
        le=100_000_000,
        description="rows compared from each side at most (sampled without replacement)",
    )
    seed: int = Field(0, ge=0, description="seed of the sample")
    max_champion_age_days: float | None = Field(
        None,
        gt=0,
        description="retrain when the champion is older than this, drift or not (unset: drift alone decides)",
    )
    prediction_drift_retrains: bool = Field(
        False,
        description="retrain when the champion's predictions drifted even if the share of drifted columns is under "
        "drift_share",
    )
    drift_experiment: str = Field(
        "trainpipe-drift",
        min_length=1,
        description="MLflow experiment the drift figures are logged to (with model_name)",
    )
    retrain_on: Literal["drift", "always"] = Field(
        "drift",
        description="drift: retrain on drift, an old champion or none; always: retrain whatever the figures (they are "
        "still measured and logged)",
    )
    trusted_packages: TrustedPackages

    @field_validator("column_methods")
    @classmethod
    def _known_methods(cls, value: dict[str, str]) -> dict[str, str]:
        for column, method in value.items():
            if method not in METHOD_NAMES:
                raise ValueError(f"{column}: {method!r} is not one of {', '.join(METHOD_NAMES)}")
        return value


class DetectDriftConfig(DetectDriftParams):
    """Everything detect_drift needs, artifacts included."""

    data: str = Field(
        ...,
        min_length=1,
        description="the new snapshot: a CSV/Parquet file, a folder of Parquet files, or a dataset artifact",
        json_schema_extra=SOURCE,
    )
    reference: str | None = Field(
        None,
        description="the reference data (default: the snapshot that trained the champion of model_name)",
        json_schema_extra=SOURCE,
    )
    output_dir: str = Field(
        ..., min_length=1, description="where drift.json and report.html go", json_schema_extra=OUTPUT
    )


class ReferenceInfo(BaseModel):
    """Where the reference came from."""

    source: str = Field(
        description="'lineage' (the champion's training snapshot), 'explicit' (the reference input) or 'none'"
    )
    path: str | None = None
    rows: int = 0
    model_version: str | None = None
    snapshot: dict[str, Any] | None = Field(None, description="the lineage's DVC record (md5, rev, path, remote, repo)")
    champion_age_days: float | None = None


class DetectDriftResult(ComponentResult):
    """What detect_drift reports: per column, the data set, the champion's predictions, and the decision."""

    dataset_drift: bool = Field(description="whether the share of drifted columns reached drift_share")
    share_drifted: float = Field(description="the share of columns that drifted")
    drift_share: float = Field(description="the share at which the dataset counts as drifted")
    drifted_columns: list[str] = Field(description="the columns that drifted")
    columns: list[ColumnResult] = Field(description="each column's test and statistic")
    prediction: ColumnResult | None = Field(
        None, description="the champion's predictions on the reference vs on the new rows"
    )
    reference: ReferenceInfo = Field(description="the reference data compared with")
    current_rows: int = Field(description="rows of the new data")
    sampled: bool = Field(False, description="whether the rows were sampled")
    sample_size: int = Field(description="rows compared per side")
    seed: int = Field(description="the sample's seed")
    retrain: bool = Field(description="whether the pipeline should retrain: drift, an old champion, or no champion")
    reasons: list[str] = Field(description="why retrain is true or false")

    def summary(self) -> str:
        share = f"share {self.share_drifted:.2f}, threshold {self.drift_share:.2f}"
        head = f"{len(self.drifted_columns)} of {len(self.columns)} columns drifted ({share})"
        if self.reference.source == "none":
            head = "no reference to compare with"
        return f"{head}; {'retrain' if self.retrain else 'no retrain'}: {self.reasons[0]}"

    def figures(self) -> dict[str, float]:
        return {"rows": float(self.current_rows)}

    def series(self) -> list[tuple[str, str, dict[str, str], float]]:
        out: list[tuple[str, str, dict[str, str], float]] = [
            ("trainpipe_drift_dataset_drift", "1 if the data set drifted", {}, float(self.dataset_drift)),
            ("trainpipe_drift_share", "share of the compared columns that drifted", {}, self.share_drifted),
            ("trainpipe_drift_retrain", "1 if the step decided to retrain", {}, float(self.retrain)),
        ]
        for c in self.columns + ([self.prediction] if self.prediction is not None else []):
            labels = {"column": c.column, "method": c.method}
            out.append(
                (
                    "trainpipe_drift_column_statistic",
                    "per column: the p-value (tests) or distance the decision used",
                    labels,
                    c.statistic,
                )
            )
            out.append(("trainpipe_drift_column_drifted", "per column: 1 if it drifted", labels, float(c.drifted)))
        return out

    def audit_events(self) -> list[dict[str, Any]]:
        return [
            {
                "action": "drift_check",
                "decision": {
                    "retrain": self.retrain,
                    "reasons": self.reasons,
                    "dataset_drift": self.dataset_drift,
                    "drifted_columns": self.drifted_columns,
                    "reference": self.reference.source,
                    "champion_version": self.reference.model_version,
                },
            }
        ]
