"""KFP v2 face of validate_data. Holds no logic: it calls the entrypoint."""

from kfp.dsl import HTML, Dataset, Input, Output

from trainpipe.faces.kfp_face import component


@component
def validate_data(
    raw_data: Input[Dataset],
    validated: Output[Dataset],
    report: Output[HTML],
    label_column: str = "label",
    suite: str = "builtin:default",
    run_id: str = "",
):
    """Run a Great Expectations suite; a failed suite fails the task (exit 3)."""
    from trainpipe.faces.kfp_runtime import copy_file, run_entrypoint

    result = run_entrypoint(
        "validate_data",
        {"data": raw_data.path, "output_dir": validated.path, "label_column": label_column, "suite": suite},
        run_id=run_id,
    )
    validated.metadata.update({"md5": result["data_md5"], "rows": result["rows"], "suite": result["suite_name"]})
    copy_file(validated.path + "/" + result["docs_page"], report.path)
