"""What training needs of a table, written once.

Each rule has two forms: the Great Expectations expectation validate_data's default suite runs,
and the pandas check train_model (and evaluate_model) run on what they read. So data that would
stop training stops at validate_data, before anything is snapshotted, and both say the same
thing: the column, and an offending row and value.

pandas is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainpipe.contract.errors import InputError
from trainpipe.contract.text import plain
from trainpipe.data.tabular import min_rows

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: The largest finite float32: training computes in float32, so a larger value becomes infinite.
FLOAT32_MAX = 3.4028234663852886e38
#: The column types Great Expectations reports for numeric pandas columns.
NUMERIC_TYPES = [
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "Float32",
    "Float64",
]
TASKS = ("classification", "regression")


@dataclass(frozen=True)
class Rule:
    """One precondition: its expectation (GX type and kwargs) and its check on a frame."""

    name: str
    expectation_type: str
    kwargs: dict[str, Any]
    check: Callable[[pd.DataFrame], str | None]

    def expectation(self) -> dict[str, Any]:
        return {"type": self.expectation_type, "kwargs": dict(self.kwargs), "meta": {"trainpipe_rule": self.name}}

    def explain(self, df: pd.DataFrame) -> str | None:
        """Why ``df`` fails this rule, or None. A rule about a column the frame lacks says nothing:
        the rule that the column exists names it (its expectation fails too)."""
        column = self.kwargs.get("column")
        if column is not None and column not in df.columns and self.expectation_type != "expect_column_to_exist":
            return None
        return self.check(df)


def _first_bad(series: pd.Series, bad: pd.Series) -> str:
    if not bad.any():
        return ""
    row = bad.idxmax()
    value = series.loc[row]
    return f"row {plain(row)} holds {plain(value)!r}"


def _not_numeric(series: pd.Series) -> pd.Series:
    import pandas as pd

    if pd.api.types.is_bool_dtype(series):
        return series.notna()
    if pd.api.types.is_numeric_dtype(series):
        return pd.Series(False, index=series.index)
    return series.notna() & pd.to_numeric(series, errors="coerce").isna()


def _out_of_range(series: pd.Series) -> pd.Series:
    import numpy as np
    import pandas as pd

    values = pd.to_numeric(series, errors="coerce").astype("float64")
    return values.notna() & ~(np.abs(values) <= FLOAT32_MAX)


def _numeric_column(column: str, role: str) -> list[Rule]:
    def numeric(df: pd.DataFrame) -> str | None:
        bad = _not_numeric(df[column])
        return f"{role} {column!r} is not numeric: {_first_bad(df[column], bad)}" if bad.any() else None

    def present(df: pd.DataFrame) -> str | None:
        bad = df[column].isna()
        return (
            f"{role} {column!r} has {int(bad.sum())} missing values (first at row {bad.idxmax()})"
            if bad.any()
            else None
        )

    def finite(df: pd.DataFrame) -> str | None:
        bad = _out_of_range(df[column])
        return (
            f"{role} {column!r} holds a value outside float32's range: {_first_bad(df[column], bad)}"
            if bad.any()
            else None
        )

    return [
        Rule(
            f"{column} is numeric",
            "expect_column_values_to_be_in_type_list",
            {"column": column, "type_list": NUMERIC_TYPES},
            numeric,
        ),
        Rule(f"{column} has no missing values", "expect_column_values_to_not_be_null", {"column": column}, present),
        Rule(
            f"{column} is finite in float32",
            "expect_column_values_to_be_between",
            {"column": column, "min_value": -FLOAT32_MAX, "max_value": FLOAT32_MAX},
            finite,
        ),
    ]


def column_rules(columns: list[str], label_column: str, task: str) -> list[Rule]:
    """The per-row rules: the label exists and is present (and numeric for regression), every
    other column is a numeric, present, finite feature."""
    if task not in TASKS:
        raise InputError(f"task: {task!r} is not one of {', '.join(TASKS)}")

    def label_exists(df: pd.DataFrame) -> str | None:
        if label_column in df.columns:
            return None
        shown = ", ".join(map(str, list(df.columns)[:10])) + ("…" if len(df.columns) > 10 else "")
        return f"label_column: {label_column!r} is not a column of the data (columns: {shown})"

    def label_present(df: pd.DataFrame) -> str | None:
        bad = df[label_column].isna()
        return (
            f"label_column: {label_column!r} has {int(bad.sum())} missing values (first at row {bad.idxmax()})"
            if bad.any()
            else None
        )

    rules = [
        Rule("the label column exists", "expect_column_to_exist", {"column": label_column}, label_exists),
        Rule(
            "the label has no missing values",
            "expect_column_values_to_not_be_null",
            {"column": label_column},
            label_present,
        ),
    ]
    if task == "regression":
        rules += [
            r
            for r in _numeric_column(label_column, "label_column:")
            if r.expectation_type != "expect_column_values_to_not_be_null"
        ]
    for column in columns:
        if column != label_column:
            rules += _numeric_column(column, "data: feature column")
    return rules


def table_rules(label_column: str, task: str, batch_size: int, test_fraction: float, seed: int) -> list[Rule]:
    """The rules on the whole table: enough rows for the split and the batch, two classes at least."""
    need = min_rows(batch_size, test_fraction, seed)

    def rows(df: pd.DataFrame) -> str | None:
        n = len(df)
        return (
            f"data: {n} rows, but batch_size {batch_size} with test_fraction {test_fraction} (seed {seed}) needs at "
            f"least {need}"
            if n < need
            else None
        )

    rules = [Rule(f"at least {need} rows", "expect_table_row_count_to_be_between", {"min_value": need}, rows)]
    if task == "classification":

        def classes(df: pd.DataFrame) -> str | None:
            values = df[label_column].dropna().unique()
            if len(values) == 0:
                return f"label_column: {label_column!r} holds no value in any row; nothing to learn"
            if len(values) == 1:
                return f"label_column: {label_column!r} has a single class ({plain(values[0])!r}); nothing to learn"
            return None

        rules.append(
            Rule(
                "the label has two classes or more",
                "expect_column_unique_value_count_to_be_between",
                {"column": label_column, "min_value": 2},
                classes,
            )
        )
    return rules


def training_suite(
    columns: list[str], label_column: str, task: str, batch_size: int, test_fraction: float, seed: int
) -> dict[str, Any]:
    """validate_data's default suite: every precondition of train_model, as GX expectations."""
    rules = column_rules(columns, label_column, task)
    if label_column in columns:
        rules += table_rules(label_column, task, batch_size, test_fraction, seed)
    else:
        rules += [
            r for r in table_rules(label_column, task, batch_size, test_fraction, seed) if "column" not in r.kwargs
        ]
    return {
        "name": "trainpipe_default",
        "meta": {
            "description": f"train_model's preconditions for task {task}, batch_size {batch_size}, test_fraction "
            f"{test_fraction}"
        },
        "expectations": [r.expectation() for r in rules],
    }


def check_frame(df: pd.DataFrame, label_column: str, task: str, feature_columns: list[str] | None = None) -> None:
    """Run the per-row rules on a frame (training or evaluation data); the first failure is an InputError.

    Raises:
        InputError: naming the column, and an offending row and value.
    """
    columns = list(feature_columns) if feature_columns is not None else [str(c) for c in df.columns]
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(f"data: feature columns missing: {', '.join(map(str, missing[:10]))}")
    if label_column not in df.columns:
        raise InputError(column_rules([], label_column, task)[0].check(df) or "")
    if not [c for c in columns if c != label_column]:
        raise InputError("data: no feature columns besides the label")
    for rule in column_rules(columns, label_column, task):
        message = rule.check(df)
        if message:
            raise InputError(message if message.startswith(("data:", "label_column:")) else f"data: {message}")


def check_table(
    df: pd.DataFrame, label_column: str, task: str, batch_size: int, test_fraction: float, seed: int
) -> None:
    """Run the whole-table rules (rows, classes).

    Raises:
        InputError: the first rule that fails.
    """
    for rule in table_rules(label_column, task, batch_size, test_fraction, seed):
        message = rule.check(df)
        if message:
            raise InputError(message)


def features_and_label(
    df: pd.DataFrame, label_column: str, feature_columns: list[str] | None = None, task: str = "classification"
) -> tuple[list[str], Any, Any]:
    """Split a frame into float32 features and the label column, refusing what training cannot use.

    Every refusal names the column and an offending row and value (see :func:`check_frame`).

    Raises:
        InputError: the label or a feature column is missing, a feature is not numeric, a value is
            missing or outside float32's range, or a regression label is not numeric.
    """
    import numpy as np

    check_frame(df, label_column, task, feature_columns)
    cols = feature_columns if feature_columns is not None else [c for c in df.columns if c != label_column]
    x = df[cols].to_numpy(dtype=np.float32)
    return [str(c) for c in cols], x, df[label_column].to_numpy()
