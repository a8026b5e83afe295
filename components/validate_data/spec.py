"""validate_data: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT

NAME = "validate_data"
#: The built-in suite, used when no suite file is given; ``{label_column}`` is filled in.
DEFAULT_SUITE = "builtin:default"
VALIDATION_FILE = "validation.json"
DOCS_DIR = "data_docs"


class ValidateDataParams(StrictModel):
    """Settings of validate_data that are not artifacts."""

    label_column: str = Field("label", min_length=1, description="name of the label column")
    suite: str = Field(
        DEFAULT_SUITE,
        min_length=1,
        description="Great Expectations suite: a JSON file path, or builtin:default",
    )
    result_format: Literal["BASIC", "SUMMARY", "COMPLETE"] = Field(
        "SUMMARY", description="Great Expectations result format"
    )


class ValidateDataConfig(ValidateDataParams):
    """Everything validate_data needs, artifacts included."""

    data: str = Field(..., min_length=1, description="the raw dataset: a .csv or .parquet file", json_schema_extra=INPUT)
    output_dir: str = Field(
        ..., min_length=1, description="where the validated dataset, the result and Data Docs go", json_schema_extra=OUTPUT
    )


class ExpectationOutcome(BaseModel):
    """The outcome of one expectation."""

    type: str
    kwargs: dict[str, Any]
    success: bool
    unexpected_count: int | None = None
    exception: str | None = None

    def describe(self) -> str:
        """One short phrase: ``expect_x(column=label): 3 unexpected``."""
        args = ", ".join(f"{k}={v}" for k, v in sorted(self.kwargs.items()) if k != "batch_id")
        tail = f": {self.unexpected_count} unexpected" if self.unexpected_count else ""
        if self.exception:
            tail = f": {self.exception}"
        return f"{self.type}({args}){tail}"


class ValidateDataResult(BaseModel):
    """What validate_data reports."""

    success: bool
    suite_name: str
    evaluated: int
    successful: int
    outcomes: list[ExpectationOutcome]
    data_file: str = Field(description="the validated dataset file inside output_dir")
    data_md5: str
    rows: int
    columns: int
    docs_index: str = Field(description="Data Docs index.html, relative to output_dir")
    docs_page: str = Field(description="this validation's Data Docs page, relative to output_dir")
    lineage: dict[str, Any] = Field(default_factory=dict)

    def summary(self) -> str:
        return f"suite {self.suite_name!r}: {self.successful}/{self.evaluated} expectations passed on {self.rows} rows"
