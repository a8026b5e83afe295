"""validate_data: the work. The default suite is checked in pandas (:mod:`checks`, GX's results) with its Data
Docs drawn by :mod:`docs`; a suite of the user's runs on Great Expectations, imported inside the function."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainpipe.components.validate_data import checks, docs
from trainpipe.components.validate_data.spec import (
    DEFAULT_SUITE,
    DOCS_DIR,
    NAME,
    TRAINING_SET_FILE,
    VALIDATION_FILE,
    ExpectationOutcome,
    ValidateDataConfig,
    ValidateDataResult,
)
from trainpipe.contract.errors import InputError, ValidationFailed
from trainpipe.contract.io import atomic_copy, atomic_write_json, copy_tree_atomic, dataset_digest, folder_mode
from trainpipe.contract.lineage import (
    FeaturesLineage,
    FeatureViewLineage,
    Lineage,
    SourceLineage,
    ValidationLineage,
)
from trainpipe.contract.runtime import Runtime
from trainpipe.contract.text import plain
from trainpipe.data.tabular import dataset_columns, find_data_file, find_dataset, parquet_files, read_table

#: Table-level expectations whose outcome over a Parquet directory is decided on all its files together.
AGGREGATED = ("expect_table_row_count_to_be_between", "expect_column_unique_value_count_to_be_between")


def load_suite(suite: str, label_column: str, columns: list[str] | None = None, config: Any = None) -> dict[str, Any]:
    """Load an expectation suite as a dict.

    Args:
        suite: A JSON file path (``{label_column}`` in its kwargs is filled in), or
            ``builtin:default``: train_model's preconditions for these columns and settings.
        label_column: The label's column.
        columns: The data's columns (the default suite checks each feature).
        config: The settings the default suite takes (task, batch_size, test_fraction, seed).

    Raises:
        InputError: the file is missing or is not a suite (a name and a list of expectations).
    """
    if suite.startswith("builtin:"):
        if suite != DEFAULT_SUITE:
            raise InputError(f"suite: unknown built-in suite {suite!r} (known: {DEFAULT_SUITE})")
        from trainpipe.data.preconditions import training_suite

        c = config
        return training_suite(
            list(columns or [label_column]),
            label_column,
            getattr(c, "task", "classification"),
            getattr(c, "batch_size", 64),
            getattr(c, "test_fraction", 0.2),
            getattr(c, "seed", 0),
        )
    path = Path(suite)
    if not path.is_file():
        raise InputError(f"suite: {suite!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8").replace("{label_column}", label_column)
        doc = json.loads(text)
    except (OSError, ValueError) as exc:
        raise InputError(f"suite: {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("expectations"), list) or not doc["expectations"]:
        raise InputError(f"suite: {str(path)!r} must be an object with a non-empty 'expectations' list")
    for i, exp in enumerate(doc["expectations"]):
        if (
            not isinstance(exp, dict)
            or not isinstance(exp.get("type"), str)
            or not isinstance(exp.get("kwargs", {}), dict)
        ):
            raise InputError(f"suite: expectation #{i} must be an object with a 'type' string and a 'kwargs' object")
    doc.setdefault("name", path.stem)
    return doc


def _aggregate(
    suite: dict[str, Any],
    runs: list[list[ExpectationOutcome]],
    rows: int,
    distinct: dict[str, set[Any]],
    files: list[Path],
) -> list[ExpectationOutcome]:
    """One outcome per expectation over every file: row-level ones pass when they pass in every
    file; the table-level ones (row count, distinct values) are decided on the whole directory."""
    out = []
    for i, exp in enumerate(suite["expectations"]):
        per_file = [run[i] for run in runs]
        first = per_file[0]
        kwargs = exp.get("kwargs", {})
        if len(runs) > 1 and exp["type"] in AGGREGATED:
            observed = rows if exp["type"] == AGGREGATED[0] else len(distinct.get(kwargs.get("column"), set()))
            lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
            ok = (lo is None or observed >= lo) and (hi is None or observed <= hi)
            out.append(
                ExpectationOutcome(
                    type=first.type,
                    kwargs=first.kwargs,
                    success=ok,
                    exception=None if ok else f"observed {observed} over all files",
                )
            )
            continue
        counts = [o.unexpected_count for o in per_file if o.unexpected_count is not None]
        exceptions = [o.exception for o in per_file if o.exception]
        examples = [
            f"{files[k].name}: {o.example}" if len(files) > 1 else o.example
            for k, o in enumerate(per_file)
            if o.example
        ]
        reasons = [
            f"{files[k].name}: {o.reason}" if len(files) > 1 else o.reason for k, o in enumerate(per_file) if o.reason
        ]
        out.append(
            ExpectationOutcome(
                type=first.type,
                kwargs=first.kwargs,
                success=all(o.success for o in per_file),
                unexpected_count=sum(counts) if counts else None,
                example=examples[0] if examples else None,
                reason=reasons[0] if reasons else None,
                exception=exceptions[0] if exceptions else None,
            )
        )
    return out


def _rules(suite_doc: dict[str, Any], config: Any, columns: list[str]) -> dict[str, Any]:
    """The training preconditions behind the default suite's expectations, by name (none for a suite of the user's)."""
    if config.suite != DEFAULT_SUITE:
        return {}
    from trainpipe.data.preconditions import column_rules, table_rules

    rules = column_rules(columns, config.label_column, config.task)
    if config.label_column in columns:
        rules += table_rules(config.label_column, config.task, config.batch_size, config.test_fraction, config.seed)
    return {r.name: r for r in rules}


def _explain(
    outcomes: list[ExpectationOutcome], suite_doc: dict[str, Any], rules: dict[str, Any], df: Any, whole_table: bool
) -> None:
    """A failed precondition says what train_model would say: the column, and a row and its value
    (or the rows the split needs), instead of GX's bare observed value."""

    def key(kind: str, kwargs: dict[str, Any]) -> str:
        return json.dumps([kind, {k: v for k, v in kwargs.items() if k != "batch_id"}], sort_keys=True, default=str)

    named = {
        key(e["type"], e.get("kwargs", {})): (e.get("meta") or {}).get("trainpipe_rule")
        for e in suite_doc["expectations"]
    }
    for outcome in outcomes:  # GX reports results in an order of its own: matched by what they expect
        rule = rules.get(named.get(key(outcome.type, outcome.kwargs)) or "")
        if outcome.success or rule is None or (outcome.type in AGGREGATED and not whole_table):
            continue
        message = rule.explain(df)
        if message:
            outcome.reason = message.removeprefix("data: ")


def _first_per_column(failed: list[ExpectationOutcome]) -> list[str]:
    """One reason per column, every failed expectation named: a column that is not numeric also fails its
    range check; the reason that names a row and value says why, the others are listed beside it."""
    by_column: dict[Any, list[ExpectationOutcome]] = {}
    for o in failed:
        by_column.setdefault(o.kwargs.get("column", id(o)), []).append(o)
    lines = []
    for group in by_column.values():
        main = next((o for o in group if o.reason), group[0])
        others = [o.type for o in group if o is not main]
        lines.append(main.describe() + (f" (also failed: {', '.join(others)})" if others else ""))
    return lines


def _outcomes(validation: dict[str, Any]) -> list[ExpectationOutcome]:
    out = []
    for r in validation["results"]:
        cfg = r["expectation_config"]
        exc = r.get("exception_info") or {}
        message = exc.get("exception_message") if exc.get("raised_exception") else None
        res = r.get("result") or {}
        values = [plain(v) for v in res.get("partial_unexpected_list") or []]
        rows = [plain(v) for v in res.get("partial_unexpected_index_list") or []]
        example = None
        if values:
            example = (
                (f"row {rows[0]} holds {values[0]!r}" if rows else f"value {values[0]!r}")
                if values[0] is not None
                else (f"row {rows[0]} is empty" if rows else None)
            )
        elif not r["success"] and res.get("observed_value") is not None:
            example = f"observed {plain(res['observed_value'])!r}"
        out.append(
            ExpectationOutcome(
                type=cfg["type"],
                kwargs={k: v for k, v in cfg.get("kwargs", {}).items() if k != "batch_id"},
                success=bool(r["success"]),
                unexpected_count=res.get("unexpected_count"),
                example=example,
                exception=(message.strip().splitlines()[0] if message else None),
            )
        )
    return out


def _progress(files: list[Path]) -> Any:
    """Progress in rows over a folder of Parquet files (their footers give the total), or None for one file."""
    if len(files) < 2:
        return None
    import pyarrow.parquet as pq

    from trainpipe.contract.progress import Progress

    return Progress(NAME, sum(pq.ParquetFile(f).metadata.num_rows for f in files), "rows")


def validate_data(config: ValidateDataConfig, lineage: Lineage, runtime: Runtime | None = None) -> ValidateDataResult:
    """Validate a dataset against a suite; copy it to the output only if it passes.

    A directory of Parquet files is validated one file at a time (memory holds one file): an
    expectation on rows passes when it passes in every file; the row count and the number of
    distinct values are decided on the whole directory.

    With ``features``, ``data`` is an entity table: the training set is first joined from the Feast
    repository point-in-time (:mod:`trainpipe.data.feature_sets`) and is what the suite checks and what is
    handed on (``training_set.parquet``); the lineage gains ``features`` (which views, as of when).

    Args:
        config: Settings and paths.
        lineage: The lineage record so far; ``source``, ``validation`` (and ``features``) are added.
        runtime: The platform's settings (the entrypoint's; validate_data uses none of them).

    Returns:
        Per-expectation outcomes, the validated data's hash and the Data Docs paths.

    Raises:
        InputError: the data or suite cannot be read.
        ValidationFailed: the suite failed; the message names the failed expectations.
            The result JSON and Data Docs are still written (without the completion marker).
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    if not config.features.strip():
        return _validate(config, lineage, find_dataset(config.data, "data"), None)
    from trainpipe.data.feature_sets import build_training_set

    entity_table = find_data_file(config.data, "data")
    staging = Path(tempfile.mkdtemp(prefix=".training_set.", dir=Path(config.output_dir)))
    try:
        built = build_training_set(
            config.feature_repo,
            config.features,
            entity_table,
            config.entity_timestamp_column,
            staging / TRAINING_SET_FILE,
        )
        return _validate(config, lineage, staging / TRAINING_SET_FILE, built, entity_table)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _validate(
    config: ValidateDataConfig, lineage: Lineage, src: Path, built: Any, entity_table: Path | None = None
) -> ValidateDataResult:
    """The suite on ``src`` (the dataset, or the training set built from the feature store), and the hand-on."""
    files = parquet_files(src) if src.is_dir() else [src]
    suite_doc = load_suite(config.suite, config.label_column, dataset_columns(src, "data"), config)
    out = Path(config.output_dir).absolute()  # GX's store backends take absolute directories only
    ran = _without_gx(config, suite_doc, files, src, out)
    if ran is None:
        checkpoint, docs_tmp = _gx_checkpoint(config, suite_doc, out)
        ran = (*_run_suite(_gx_runner(checkpoint), files, suite_doc, config, src)[:4], docs_tmp)
    validations, outcomes, rows, columns, docs_tmp = ran
    if built is not None:
        _name_views(outcomes, built)
    docs = out / DOCS_DIR
    shutil.rmtree(docs, ignore_errors=True)
    os.replace(docs_tmp, docs)
    pages = sorted((docs / "validations").rglob("*.html"))
    result = ValidateDataResult(
        success=all(o.success for o in outcomes),
        suite_name=suite_doc["name"],
        evaluated=len(outcomes),
        successful=sum(o.success for o in outcomes),
        outcomes=outcomes,
        data_file=src.name,
        files=len(files),
        data_md5=dataset_digest(src),
        rows=rows,
        columns=columns,
        docs_index=f"{DOCS_DIR}/index.html",
        docs_page=str(pages[-1].relative_to(out)) if pages else f"{DOCS_DIR}/index.html",
    )
    # the raw data: the dataset validated, or the entity table a training set was joined from
    source = (
        SourceLineage(uri=str(src.resolve()), md5=result.data_md5, rows=result.rows, columns=result.columns)
        if built is None
        else SourceLineage(
            uri=str(Path(entity_table or src).resolve()),
            md5=built.entity_md5,
            rows=built.entity_rows,
            columns=built.entity_columns,
        )
    )
    result.lineage = Lineage.of(lineage).with_(
        source=source,
        features=None if built is None else _features_lineage(built),
        validation=ValidationLineage(
            suite=result.suite_name, success=result.success, evaluated=result.evaluated, successful=result.successful
        ),
    )
    gx_results = validations[0] if len(validations) == 1 else validations
    atomic_write_json(out / VALIDATION_FILE, {"result": result.model_dump(mode="json"), "gx": gx_results})
    _hand_on(result, src, out / src.name)
    return result


def _name_views(outcomes: list[ExpectationOutcome], built: Any) -> None:
    """A feature column's missing values name the feature view that had none at those rows' moments:
    the column alone does not say which view of the feature store to look at."""
    for outcome in outcomes:
        if not outcome.success and outcome.type == "expect_column_values_to_not_be_null":
            outcome.origin = built.why_missing(str(outcome.kwargs.get("column")))


def _features_lineage(built: Any) -> FeaturesLineage:
    return FeaturesLineage(
        repo=built.repo,
        project=built.project,
        service=built.service,
        views={name: FeatureViewLineage(**view) for name, view in built.views.items()},
        entity_md5=built.entity_md5,
        timestamp_column=built.timestamp_column,
        as_of_min=built.as_of_min,
        as_of_max=built.as_of_max,
    )


def _gx_checkpoint(config: ValidateDataConfig, suite_doc: dict[str, Any], out: Path) -> tuple[Any, Path]:
    """A GX checkpoint that runs the suite on one DataFrame at a time and builds Data Docs in a
    hidden folder of ``out`` (renamed into place once every file ran).

    Raises:
        InputError: the suite names an expectation GX does not have, or is not a valid suite.
    """
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.expectations.registry import get_expectation_impl

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch = (
        ctx.data_sources.add_pandas("trainpipe").add_dataframe_asset("data").add_batch_definition_whole_dataframe("all")
    )
    # GX would drop an expectation it does not know (printing a traceback) and run the rest:
    # a suite must run whole, so an unknown type is bad input
    unknown = []
    for exp in suite_doc["expectations"]:
        try:
            get_expectation_impl(exp["type"])
        except Exception:
            unknown.append(exp["type"])
    if unknown:
        raise InputError(f"suite: {config.suite!r} names expectations GX does not have: {', '.join(unknown)}")
    try:
        suite = ctx.suites.add(gx.ExpectationSuite(**suite_doc))
    except Exception as exc:  # GX raises several kinds for a bad suite
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"suite: {config.suite!r} is not a valid expectation suite: {msg}") from None
    definition = ctx.validation_definitions.add(gx.ValidationDefinition(name="trainpipe", data=batch, suite=suite))
    docs_tmp = Path(tempfile.mkdtemp(prefix=".data_docs.", dir=out))
    os.chmod(docs_tmp, folder_mode())  # mkdtemp's 0700: data_docs/ is an output like the others (0750 by default)
    store = {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_tmp)}
    site = {
        "class_name": "SiteBuilder",
        "store_backend": store,
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }
    ctx.add_data_docs_site(site_name="trainpipe", site_config=site)
    checkpoint = ctx.checkpoints.add(
        gx.Checkpoint(
            name="trainpipe",
            validation_definitions=[definition],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="docs", site_names=["trainpipe"])],
            result_format={"result_format": config.result_format},
        )
    )
    return checkpoint, docs_tmp


class _NeedsGX(Exception):
    """A table whose dtypes the checks without GX do not cover (:func:`checks.supported_frame`)."""


def _gx_runner(checkpoint: Any) -> Callable[[Any], dict[str, Any]]:
    def run(df: Any) -> dict[str, Any]:
        (validation,) = [
            v.to_json_dict() for v in checkpoint.run(batch_parameters={"dataframe": df}).run_results.values()
        ]
        return validation

    return run


def _without_gx(
    config: ValidateDataConfig, suite_doc: dict[str, Any], files: list[Path], src: Path, out: Path
) -> tuple[list[dict[str, Any]], list[Any], int, int, Path] | None:
    """The default suite checked in pandas (:mod:`checks`, GX's results without GX's import) and its Data Docs
    drawn without GX (:mod:`docs`); None where GX runs it: a suite of the user's, or a table with a dtype
    the checks do not cover (a category, a date, pandas' string dtype)."""
    if config.suite != DEFAULT_SUITE or not checks.supported(suite_doc):
        return None

    def run(df: Any) -> dict[str, Any]:
        if not checks.supported_frame(df):
            raise _NeedsGX
        return checks.validate(suite_doc, df, config.result_format)

    try:
        validations, outcomes, rows, columns, runs = _run_suite(run, files, suite_doc, config, src)
    except _NeedsGX:
        return None
    docs_tmp = Path(tempfile.mkdtemp(prefix=".data_docs.", dir=out))
    os.chmod(docs_tmp, folder_mode())  # mkdtemp's 0700: data_docs/ is an output like the others (0750 by default)
    reasons = [{i: o.reason for i, o in enumerate(per_file) if o.reason} for per_file in runs]
    docs.write_site(docs_tmp, validations, [f.name for f in files], reasons)
    return validations, outcomes, rows, columns, docs_tmp


def _run_suite(
    run_one: Callable[[Any], dict[str, Any]],
    files: list[Path],
    suite_doc: dict[str, Any],
    config: ValidateDataConfig,
    src: Path,
) -> tuple[list[dict[str, Any]], list[Any], int, int, list[list[ExpectationOutcome]]]:
    """The suite on every file, one in memory at a time (``run_one``: GX's validation result of a frame):
    the validations, the outcomes decided on the whole dataset, its rows and columns, each file's outcomes."""
    aggregated_columns = {e["kwargs"].get("column") for e in suite_doc["expectations"] if e["type"] == AGGREGATED[1]}
    rules = _rules(suite_doc, config, dataset_columns(src, "data"))
    runs, validations, rows, columns = [], [], 0, 0
    distinct: dict[str, set[Any]] = {}
    progress = _progress(files)
    for path in files:
        df = read_table(path, "data")
        columns = columns or int(df.shape[1])  # the first file's (every file has the same columns)
        validation = run_one(df)
        validations.append(validation)
        runs.append(_outcomes(validation))
        _explain(runs[-1], suite_doc, rules, df, whole_table=len(files) == 1)
        rows += int(df.shape[0])
        for col in aggregated_columns:
            if col in df.columns:
                distinct.setdefault(col, set()).update(plain(v) for v in df[col].dropna().unique())
        del df
        if progress is not None:
            progress.update(rows)
    if progress is not None:
        progress.finish()
    return validations, _aggregate(suite_doc, runs, rows, distinct, files), rows, columns, runs


def _hand_on(result: ValidateDataResult, src: Path, data_out: Path) -> None:
    """The validated data to the output when the suite passed; otherwise none of it, and the failure.

    Raises:
        ValidationFailed: the suite failed; the message names the failed expectations.
    """
    if not result.success:
        if data_out.is_dir():
            shutil.rmtree(data_out, ignore_errors=True)
        else:
            data_out.unlink(missing_ok=True)
        failed = [o for o in result.outcomes if not o.success]
        raise ValidationFailed(
            f"suite {result.suite_name!r} failed {len(failed)} of {len(result.outcomes)} expectations: "
            + "; ".join(_first_per_column(failed))
        )
    if src.is_dir():
        copy_tree_atomic(src, data_out)
    else:
        atomic_copy(src, data_out)


__all__ = ["NAME", "load_suite", "validate_data"]
