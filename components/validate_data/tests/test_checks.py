"""The default suite without GX (checks.py) says what GX says: on generated tables, as CSV and Parquet read
them, every expectation's success, unexpected count, first unexpected rows, observed value and whether it
raised are GX's own."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainpipe.components.validate_data import checks
from trainpipe.data.preconditions import training_suite

#: Cells a CSV of a team's could hold: numbers of every form, empties, words, float32's edges and beyond.
CELLS = st.one_of(
    st.integers(-(2**40), 2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
    st.sampled_from(["", "NA", "nan", "inf", "-inf", "1e39", "-3.5e38", "3.4e38", "true", "False", "x", "1,5", " 7"]),
)


@pytest.fixture(scope="module")
def gx_run():
    """One ephemeral GX context for the module: the suite run by hand on a frame, as validate_data ran it."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch = ctx.data_sources.add_pandas("t").add_dataframe_asset("d").add_batch_definition_whole_dataframe("all")
    n = [0]

    def run(suite_doc: dict[str, Any], df: Any, result_format: str) -> dict[str, Any]:
        n[0] += 1
        suite = ctx.suites.add(gx.ExpectationSuite(**{**suite_doc, "name": f"s{n[0]}"}))
        vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=f"v{n[0]}", data=batch, suite=suite))
        return vd.run(batch_parameters={"dataframe": df}, result_format={"result_format": result_format}).to_json_dict()

    return run


def _key(r: dict[str, Any]) -> str:
    cfg = r["expectation_config"]
    return repr((cfg["type"], sorted((k, repr(v)) for k, v in cfg["kwargs"].items() if k != "batch_id")))


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    res = r.get("result") or {}
    return {
        "success": r["success"],
        "raised": bool((r.get("exception_info") or {}).get("raised_exception"))
        or any(v.get("raised_exception") for v in (r.get("exception_info") or {}).values() if isinstance(v, dict)),
        "observed": res.get("observed_value"),
        "unexpected": res.get("unexpected_count"),
        "rows": res.get("partial_unexpected_index_list"),
        "missing": res.get("missing_count"),
    }


def _same(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    mine = {_key(r): _summary(r) for r in ours["results"]}
    gx = {_key(r): _summary(r) for r in theirs["results"]}
    assert mine.keys() == gx.keys()
    for k in gx:
        assert mine[k] == gx[k], k
    assert ours["success"] == theirs["success"]


@st.composite
def tables(draw: Any) -> tuple[str, int]:
    """A CSV of 1-4 feature columns and a label, 0-12 rows; and a batch size for the row-count rule."""
    n_cols, n_rows = draw(st.integers(1, 4)), draw(st.integers(0, 12))
    header = [f"f{i}" for i in range(n_cols)] + ["label"]
    labels = st.one_of(st.sampled_from(["0", "1", "2", "", "a"]), CELLS)
    lines = [",".join(header)]
    for _ in range(n_rows):
        cells = [draw(CELLS).replace(",", "") for _ in range(n_cols)] + [draw(labels).replace(",", "")]
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n", draw(st.integers(1, 6))


@pytest.mark.integration
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=tables(), task=st.sampled_from(["classification", "regression"]), fmt=st.sampled_from(checks.FORMATS))
def test_default_suite_results_equal_gx(gx_run, table, task, fmt):
    import pandas as pd

    text, batch = table
    df = pd.read_csv(io.StringIO(text))
    suite = training_suite([str(c) for c in df.columns], "label", task, batch, 0.2, 0)
    assert checks.supported(suite)
    _same(checks.validate(suite, df, fmt), gx_run(suite, df, fmt))


@pytest.mark.integration
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=tables(), dtype=st.sampled_from(["Int64", "Float64", "category", "string", "bool", "int32", "float32"]))
def test_default_suite_results_equal_gx_on_parquet_dtypes(gx_run, table, dtype):
    """Parquet keeps the dtypes a CSV never yields (nullable integers, categories, strings, narrow floats)."""
    import pandas as pd

    text, batch = table
    df = pd.read_csv(io.StringIO(text))
    try:
        df["f0"] = df["f0"].astype(dtype)
    except (TypeError, ValueError, OverflowError):
        return  # a column that dtype cannot hold: Parquet would never hand it over that way
    suite = training_suite([str(c) for c in df.columns], "label", "classification", batch, 0.2, 0)
    if not checks.supported_frame(df):  # validate_data runs such a table on GX
        assert dtype in ("category", "string")
        return
    _same(checks.validate(suite, df, "SUMMARY"), gx_run(suite, df, "SUMMARY"))


@pytest.mark.unit
def test_only_the_default_suites_kinds_run_without_gx():
    suite = training_suite(["a", "label"], "label", "classification", 8, 0.2, 0)
    assert checks.supported(suite)
    assert not checks.supported({"expectations": [{"type": "expect_column_values_to_match_regex", "kwargs": {}}]})
    mostly = {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "a", "mostly": 0.9}}
    assert not checks.supported({"expectations": [mostly]})
    python_names = {"type": "expect_column_values_to_be_in_type_list", "kwargs": {"column": "a", "type_list": ["int"]}}
    assert not checks.supported({"expectations": [python_names]})


_PROBE = """
import sys, json
from trainpipe.components.validate_data.core import validate_data
from trainpipe.components.validate_data.spec import ValidateDataConfig
from trainpipe.contract.errors import ValidationFailed
from trainpipe.contract.lineage import Lineage
try:
    validate_data(ValidateDataConfig(**json.loads(sys.argv[1])), Lineage())
except ValidationFailed:
    pass
print(json.dumps("great_expectations" in sys.modules))
"""


@pytest.mark.integration
@pytest.mark.parametrize("own_suite", [False, True])
def test_default_suite_runs_without_gx_and_a_users_suite_on_gx(tmp_path, own_suite):
    """The default suite never imports GX and still writes Data Docs naming the failure as training would;
    the same expectations given as a suite file run on GX, with GX's Data Docs."""
    import json
    import subprocess
    import sys

    data = tmp_path / "d.csv"
    data.write_text("f1,f2,label\n" + "".join(f"{i},{'x' if i == 3 else i},{i % 2}\n" for i in range(30)))
    settings_ = {"data": str(data), "output_dir": str(tmp_path / "out"), "batch_size": 4}
    if own_suite:
        suite = training_suite(["f1", "f2", "label"], "label", "classification", 4, 0.2, 0)
        (tmp_path / "suite.json").write_text(json.dumps(suite))
        settings_["suite"] = str(tmp_path / "suite.json")
    (tmp_path / "out").mkdir()
    got = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(settings_)], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout.strip().splitlines()[-1]) is own_suite
    record = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert not record["result"]["success"]
    page = (tmp_path / "out" / record["result"]["docs_page"]).read_text()
    assert (tmp_path / "out" / record["result"]["docs_index"]).is_file()
    assert "row 3 holds" in page if not own_suite else "great_expectations" in page.lower()
