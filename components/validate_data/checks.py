"""The default suite without Great Expectations.

The default suite (:func:`trainpipe.data.preconditions.training_suite`) uses six expectation types. Each is
evaluated here in pandas the way GX 1.x evaluates it on a pandas frame, and reported in GX's result form
(success, unexpected count, the first unexpected values and rows, the observed value, a raised
exception): so checking training's preconditions costs pandas' import, not GX's (seconds in every step,
several times the check itself). A test holds these results to GX's on generated tables. A suite of the
user's, or one that uses anything else, runs on GX unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainpipe.contract.text import plain

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: The expectation types evaluated here, and the kwargs each may carry (any other kwarg: GX runs the suite).
KWARGS: dict[str, frozenset[str]] = {
    "expect_column_to_exist": frozenset({"column"}),
    "expect_column_values_to_not_be_null": frozenset({"column"}),
    "expect_column_values_to_be_in_type_list": frozenset({"column", "type_list"}),
    "expect_column_values_to_be_between": frozenset({"column", "min_value", "max_value"}),
    "expect_table_row_count_to_be_between": frozenset({"min_value", "max_value"}),
    "expect_column_unique_value_count_to_be_between": frozenset({"column", "min_value", "max_value"}),
}
#: GX's length of the partial lists (``partial_unexpected_list``, its index list).
PARTIAL = 20
#: GX's result formats, each evaluated here.
FORMATS = ("BASIC", "SUMMARY", "COMPLETE")
#: Type names GX maps to Python's own types (``native_type_type_map``): not evaluated here.
NATIVE_NAMES = frozenset(
    {"none", "bool", "int", "long", "float", "bytes", "complex", "str", "string_types", "list", "dict", "unicode"}
)


def supported(suite_doc: dict[str, Any]) -> bool:
    """Whether every expectation of the suite is one evaluated here, with kwargs it understands."""
    for exp in suite_doc.get("expectations", []):
        kinds = KWARGS.get(exp.get("type", ""))
        if kinds is None or not set(exp.get("kwargs", {})) <= kinds:
            return False
        if exp["type"] == "expect_column_values_to_be_in_type_list":
            names = exp["kwargs"].get("type_list")
            # GX also maps Python's names (int, str, bool …) to Python types: those suites run on GX
            if not names or any(str(n).lower() in NATIVE_NAMES for n in names):
                return False
    return True


def supported_frame(df: pd.DataFrame) -> bool:
    """Whether every column's dtype is one whose results here are GX's (numpy's numbers and booleans, pandas'
    nullable numbers, Python objects as CSV reads them). Categories, dates and pandas' string dtype run on GX:
    there GX's results depend on its internals (a categorical column of one value raises in its range check)."""
    import pandas as pd

    for dtype in df.dtypes:
        if isinstance(dtype, pd.api.extensions.ExtensionDtype):
            if not isinstance(dtype, (pd.core.arrays.integer.IntegerDtype, pd.core.arrays.floating.FloatingDtype)):
                return False
        elif dtype.kind not in "biufO":
            return False
    return True


def validate(suite_doc: dict[str, Any], df: pd.DataFrame, result_format: str = "SUMMARY") -> dict[str, Any]:
    """The suite on one frame, as GX's validation result would hold it (``to_json_dict``'s shape, the keys
    validate_data reads and Data Docs shows).

    Args:
        suite_doc: A suite every expectation of which :func:`supported` accepts.
        df: The table.
        result_format: GX's: SUMMARY and COMPLETE list the unexpected rows; COMPLETE lists them all.
    """
    results = [_one(exp, df, result_format) for exp in suite_doc["expectations"]]
    good = sum(r["success"] for r in results)
    return {
        "success": good == len(results),
        "suite_name": suite_doc["name"],
        "statistics": {
            "evaluated_expectations": len(results),
            "successful_expectations": good,
            "unsuccessful_expectations": len(results) - good,
            "success_percent": 100.0 * good / len(results) if results else None,
        },
        "results": results,
        "meta": {"checked_by": "trainpipe (pandas; GX 1.x's semantics)"},
    }


def _one(exp: dict[str, Any], df: pd.DataFrame, result_format: str) -> dict[str, Any]:
    kind, kwargs = exp["type"], dict(exp.get("kwargs", {}))
    config = {"type": kind, "kwargs": kwargs, "meta": exp.get("meta") or {}}
    column = kwargs.get("column")
    try:
        if kind == "expect_table_row_count_to_be_between":
            return _observed(config, len(df), kwargs)
        if kind == "expect_column_to_exist":
            return {"expectation_config": config, "success": column in df.columns, "result": {}}
        if column not in df.columns:
            raise KeyError(f'The column "{column}" in BatchData does not exist.')
        series = df[column]
        if kind == "expect_column_unique_value_count_to_be_between":
            return _observed(config, int(series.nunique(dropna=True)), kwargs)
        if kind == "expect_column_values_to_not_be_null":
            return _map(config, series, series.isna(), result_format, skip_nulls=False)
        if kind == "expect_column_values_to_be_in_type_list":
            return _type_list(config, series, list(kwargs["type_list"]), result_format)
        return _map(config, series, _outside(series, kwargs.get("min_value"), kwargs.get("max_value")), result_format)
    except (KeyError, TypeError, ValueError) as exc:  # as GX: the expectation fails, naming the exception
        return {
            "expectation_config": config,
            "success": False,
            "result": {},
            "exception_info": {
                "raised_exception": True,
                "exception_message": f"{type(exc).__name__}: {exc}",
                "exception_traceback": None,
            },
        }


def _observed(config: dict[str, Any], observed: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
    ok = (lo is None or observed >= lo) and (hi is None or observed <= hi)
    return {"expectation_config": config, "success": bool(ok), "result": {"observed_value": observed}}


def _map(
    config: dict[str, Any], series: pd.Series, unexpected: pd.Series, result_format: str, skip_nulls: bool = True
) -> dict[str, Any]:
    """A column map expectation's result: nulls are neither expected nor unexpected (GX's ``missing``)."""
    total = len(series)
    missing = series.isna() if skip_nulls else None
    bad = unexpected & ~missing if missing is not None else unexpected
    rows = series.index[bad.to_numpy(dtype=bool)]
    count = len(rows)
    values = [plain(v) for v in series.loc[rows[:PARTIAL]]] if count else []
    result: dict[str, Any] = {
        "element_count": total,
        "unexpected_count": count,
        "unexpected_percent": 100.0 * count / (total - (int(missing.sum()) if missing is not None else 0))
        if total - (int(missing.sum()) if missing is not None else 0)
        else None,
        "partial_unexpected_list": values,
    }
    if missing is not None:
        n_missing = int(missing.sum())
        result["missing_count"] = n_missing
        result["missing_percent"] = 100.0 * n_missing / total if total else None
    if result_format != "BASIC":
        result["partial_unexpected_index_list"] = [plain(i) for i in rows[:PARTIAL]]
    if result_format == "COMPLETE":
        result["unexpected_list"] = [plain(v) for v in series.loc[rows]]
        result["unexpected_index_list"] = [plain(i) for i in rows]
    return {"expectation_config": config, "success": count == 0, "result": result}


def _outside(series: pd.Series, lo: Any, hi: Any) -> pd.Series:
    """Values not between ``lo`` and ``hi``: compared as numbers for an int or float column, one value at a
    time otherwise, where a string compared with a number is GX's TypeError (the expectation raises)."""
    import numpy as np
    import pandas as pd

    if lo is None and hi is None:
        raise ValueError("min_value and max_value cannot both be None")
    if series.dtype in (np.dtype(int), np.dtype(float)):
        inside = pd.Series(True, index=series.index)
        if lo is not None:
            inside &= series >= lo
        if hi is not None:
            inside &= series <= hi
        return ~inside

    def between(v: Any) -> bool:
        if v is None or (not isinstance(v, str) and pd.isna(v)):
            return True  # a null: skipped by the caller
        if any(bound is not None and isinstance(v, str) != isinstance(bound, str) for bound in (lo, hi)):
            raise TypeError("Column values, min_value, and max_value must either be None or of the same type.")
        return bool((lo is None or v >= lo) and (hi is None or v <= hi))

    return ~series.map(between).astype(bool)


def _type_list(config: dict[str, Any], series: pd.Series, type_list: list[str], result_format: str) -> dict[str, Any]:
    """An object column: each value's type (nulls skipped); any other column: its dtype, decided at once."""
    if series.dtype.type.__name__ == "object_":
        scalars = tuple(_comparable(type_list, instances=False))
        return _map(config, series, ~series.map(lambda v: isinstance(v, scalars)).astype(bool), result_format)
    ok = series.dtype in _comparable(type_list, instances=True)
    return {"expectation_config": config, "success": bool(ok), "result": {"observed_value": series.dtype.type.__name__}}


def _comparable(type_list: list[str], instances: bool) -> list[Any]:
    """What GX compares with: for an object column's values, the scalar types (numpy's, pandas' classes);
    for a column's dtype, numpy's scalar types and dtypes, pandas' dtype classes and their instances."""
    import numpy as np
    import pandas as pd

    out: list[Any] = []
    for name in type_list:
        try:
            out.append(np.dtype(name).type)
            if instances:
                out.append(np.dtype(name))
            continue
        except TypeError:
            pass
        found = getattr(pd, name, None)
        if isinstance(found, type):
            out.append(found)
            if instances:
                try:
                    if isinstance(found(), pd.api.extensions.ExtensionDtype):
                        out.append(found())
                except TypeError:
                    pass
        found = getattr(pd.core.dtypes.dtypes, name, None)
        if isinstance(found, type):
            out.append(found)
    return out


__all__ = ["KWARGS", "supported", "supported_frame", "validate"]
