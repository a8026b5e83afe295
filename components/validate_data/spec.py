"""validate_data: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import OUTPUT, SOURCE
from trainpipe.contract.result import ComponentResult

NAME = "validate_data"
#: The built-in suite, used when no suite file is given; ``{label_column}`` is filled in.
DEFAULT_SUITE = "builtin:default"
VALIDATION_FILE = "validation.json"
#: The training set built from a feature store, as validate_data hands it on.
TRAINING_SET_FILE = "training_set.parquet"
DOCS_DIR = "data_docs"


class ValidateDataParams(StrictModel):
    """Settings of validate_data that are not artifacts.

    ``task``, ``batch_size``, ``test_fraction`` and ``seed`` are train_model's settings of the same
    names: the default suite checks every precondition of training with them, so data training
    would refuse stops here, before it is snapshotted.
    """

    label_column: str = Field("label", min_length=1, description="name of the label column")
    suite: str = Field(
        DEFAULT_SUITE,
        min_length=1,
        description="Great Expectations suite: a JSON file path, or builtin:default (train_model's preconditions)",
    )
    task: Literal["classification", "regression"] = Field(
        "classification", description="as train_model's: what the label is"
    )
    batch_size: int = Field(64, ge=1, le=10_000_000, description="as train_model's: the rows one global batch needs")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="as train_model's: the held-out share")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="as train_model's: the split's seed")
    result_format: Literal["BASIC", "SUMMARY", "COMPLETE"] = Field(
        "SUMMARY", description="Great Expectations result format"
    )
    features: str = Field(
        "",
        description="a training set from Feast: a feature service's name, or view:feature references separated by "
        "commas; data is then the entity table (join keys, timestamps, label), joined point-in-time. Empty: data "
        "is the dataset",
    )
    feature_repo: str = Field(
        "", description="the Feast feature repository (a folder holding feature_store.yaml) the features come from"
    )
    entity_timestamp_column: str = Field(
        "event_timestamp",
        min_length=1,
        description="the entity table's timestamp column: each row gets the features as of this moment",
    )

    @model_validator(mode="after")
    def _repo_with_features(self) -> ValidateDataParams:
        if self.features.strip() and not self.feature_repo.strip():
            raise ValueError("feature_repo: features come from a Feast repository; name its folder")
        return self


class ValidateDataConfig(ValidateDataParams):
    """Everything validate_data needs, artifacts included."""

    data: str = Field(
        ...,
        min_length=1,
        description="the raw dataset: a .csv or .parquet file, or a directory of .parquet files (with features: the "
        "entity table, one file)",
        json_schema_extra=SOURCE,
    )
    output_dir: str = Field(
        ...,
        min_length=1,
        description="where the validated dataset, the result and Data Docs go",
        json_schema_extra=OUTPUT,
    )


class ExpectationOutcome(BaseModel):  # type: ignore[no-redef]  # pydantic's plugin: a field named kwargs
    """The outcome of one expectation."""

    type: str
    kwargs: dict[str, Any]
    success: bool
    unexpected_count: int | None = None
    example: str | None = Field(None, description="the first unexpected row and value, when GX reports them")
    reason: str | None = Field(
        None, description="a training precondition that failed: what train_model would say (column, row, value)"
    )
    exception: str | None = None
    origin: str | None = Field(
        None,
        description="where a feature column's missing values come from (a training set from a feature store): the "
        "feature view that had no value at those rows' moments",
    )

    def describe(self) -> str:
        """One short phrase: ``expect_x(column=label): 3 unexpected (first: row 4 holds 'N/A')``."""
        args = ", ".join(
            f"{k}={v}"
            for k, v in sorted(self.kwargs.items())
            if k not in ("batch_id", "type_list", "min_value", "max_value")
            or (k in ("min_value", "max_value") and abs(v or 0) < 1e38)
        )
        tail = f": {self.unexpected_count} unexpected" if self.unexpected_count else ""
        if self.example:
            tail += f" ({'first: ' if self.unexpected_count else ''}{self.example})"
        if self.exception:
            tail = f": {self.exception}"
        if self.reason:
            tail = f": {self.reason}"
        if self.origin:
            tail += f", {self.origin}"
        return f"{self.type}({args}){tail}"


class ValidateDataResult(ComponentResult):
    """What validate_data reports."""

    success: bool = Field(description="whether every expectation held")
    suite_name: str = Field(description="the suite run")
    evaluated: int = Field(description="expectations evaluated")
    successful: int = Field(description="expectations that held")
    outcomes: list[ExpectationOutcome] = Field(description="each expectation's outcome")
    data_file: str = Field(
        description="the validated dataset (a file, or a folder of .parquet files) inside output_dir"
    )
    files: int = Field(1, description="data files validated (a Parquet directory's parts, one at a time)")
    data_md5: str = Field(description="md5 of the validated data")
    rows: int = Field(description="rows validated")
    columns: int = Field(description="columns validated")
    docs_index: str = Field(description="Data Docs index.html, relative to output_dir")
    docs_page: str = Field(description="this validation's Data Docs page, relative to output_dir")

    def figures(self) -> dict[str, float]:
        return {"rows": float(self.rows)}

    def summary(self) -> str:
        return f"suite {self.suite_name!r}: {self.successful}/{self.evaluated} expectations passed on {self.rows} rows"
