"""validate_data: the work. Great Expectations is imported inside the function."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from trainpipe.components.validate_data.spec import (
    DOCS_DIR,
    NAME,
    VALIDATION_FILE,
    ExpectationOutcome,
    ValidateDataConfig,
    ValidateDataResult,
)
from trainpipe.contract.errors import InputError, ValidationFailed
from trainpipe.contract.io import atomic_copy, atomic_write_json, file_digest
from trainpipe.tabular import find_data_file, read_table

_SUITES = Path(__file__).parent / "suites"


def load_suite(suite: str, label_column: str) -> dict[str, Any]:
    """Load an expectation suite as a dict, filling ``{label_column}`` placeholders.

    Args:
        suite: A JSON file path, or ``builtin:<name>`` for a suite shipped with trainpipe.
        label_column: Substituted for ``{label_column}`` in the suite's kwargs.

    Raises:
        InputError: the file is missing or is not a suite (a name and a list of expectations).
    """
    if suite.startswith("builtin:"):
        path = _SUITES / f"{suite.split(':', 1)[1]}.json"
        if not path.is_file():
            known = ", ".join(f"builtin:{p.stem}" for p in sorted(_SUITES.glob("*.json")))
            raise InputError(f"suite: unknown built-in suite {suite!r} (known: {known})")
    else:
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
        if not isinstance(exp, dict) or not isinstance(exp.get("type"), str) or not isinstance(exp.get("kwargs", {}), dict):
            raise InputError(f"suite: expectation #{i} must be an object with a 'type' string and a 'kwargs' object")
    doc.setdefault("name", path.stem)
    return doc


def _outcomes(validation: dict[str, Any]) -> list[ExpectationOutcome]:
    out = []
    for r in validation["results"]:
        cfg = r["expectation_config"]
        exc = r.get("exception_info") or {}
        message = exc.get("exception_message") if exc.get("raised_exception") else None
        res = r.get("result") or {}
        out.append(
            ExpectationOutcome(
                type=cfg["type"],
                kwargs={k: v for k, v in cfg.get("kwargs", {}).items() if k != "batch_id"},
                success=bool(r["success"]),
                unexpected_count=res.get("unexpected_count"),
                exception=(message.strip().splitlines()[0] if message else None),
            )
        )
    return out


def validate_data(config: ValidateDataConfig, lineage: dict[str, Any]) -> ValidateDataResult:
    """Validate a dataset against a suite; copy it to the output only if it passes.

    Args:
        config: Settings and paths.
        lineage: The lineage record so far; ``source`` and ``validation`` are added.

    Returns:
        Per-expectation outcomes, the validated file's md5 and the Data Docs paths.

    Raises:
        InputError: the data or suite cannot be read.
        ValidationFailed: the suite failed; the message names the failed expectations.
            The result JSON and Data Docs are still written (without the completion marker).
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    src = find_data_file(config.data, "data")
    suite_doc = load_suite(config.suite, config.label_column)
    df = read_table(src, "data")
    out = Path(config.output_dir).absolute()  # GX's store backends take absolute directories only

    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch = ctx.data_sources.add_pandas("trainpipe").add_dataframe_asset("data").add_batch_definition_whole_dataframe("all")
    # GX would drop an expectation it does not know (printing a traceback) and run the rest:
    # a suite must run whole, so an unknown type is bad input
    from great_expectations.expectations.registry import get_expectation_impl

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
    ctx.add_data_docs_site(
        site_name="trainpipe",
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_tmp)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    checkpoint = ctx.checkpoints.add(
        gx.Checkpoint(
            name="trainpipe",
            validation_definitions=[definition],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="docs", site_names=["trainpipe"])],
            result_format={"result_format": config.result_format},
        )
    )
    run = checkpoint.run(batch_parameters={"dataframe": df})
    (validation,) = [v.to_json_dict() for v in run.run_results.values()]

    docs = out / DOCS_DIR
    shutil.rmtree(docs, ignore_errors=True)
    os.replace(docs_tmp, docs)
    pages = sorted((docs / "validations").rglob("*.html"))
    outcomes = _outcomes(validation)
    passed = [o for o in outcomes if o.success]
    data_file = out / src.name
    result = ValidateDataResult(
        success=bool(run.success),
        suite_name=suite_doc["name"],
        evaluated=len(outcomes),
        successful=len(passed),
        outcomes=outcomes,
        data_file=src.name,
        data_md5=file_digest(src),
        rows=int(df.shape[0]),
        columns=int(df.shape[1]),
        docs_index=f"{DOCS_DIR}/index.html",
        docs_page=str(pages[-1].relative_to(out)) if pages else f"{DOCS_DIR}/index.html",
    )
    lineage = dict(lineage)
    lineage["source"] = {"uri": str(src.resolve()), "md5": result.data_md5, "rows": result.rows, "columns": result.columns}
    lineage["validation"] = {
        "suite": result.suite_name,
        "success": result.success,
        "evaluated": result.evaluated,
        "successful": result.successful,
    }
    result.lineage = lineage
    atomic_write_json(out / VALIDATION_FILE, {"result": result.model_dump(mode="json"), "gx": validation})
    if not result.success:
        data_file.unlink(missing_ok=True)
        failed = [o.describe() for o in outcomes if not o.success]
        raise ValidationFailed(
            f"suite {result.suite_name!r} failed {len(failed)} of {len(outcomes)} expectations: " + "; ".join(failed)
        )
    atomic_copy(src, data_file)
    return result


__all__ = ["NAME", "load_suite", "validate_data"]
