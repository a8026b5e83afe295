"""KFP v2 face of validate_data. Holds no logic: it calls the entrypoint."""

from kfp.dsl import HTML, Dataset, Input, Output

from trainpipe.faces.kfp_face import component


@component
def validate_data(
    data: Input[Dataset],
    validated: Output[Dataset],
    report: Output[HTML],
    label_column: str = "label",
    suite: str = "builtin:default",
    result_format: str = "SUMMARY",
    task: str = "classification",
    batch_size: int = 64,
    test_fraction: float = 0.2,
    seed: int = 0,
    run_id: str = "",
):
    """Run a Great Expectations suite (default: train_model's preconditions); a failed suite fails the task (exit 3)."""
    from trainpipe.faces.kfp_runtime import copy_file, run_entrypoint

    result = run_entrypoint(
        "validate_data",
        {
            "data": data.path,
            "output_dir": validated.path,
            "label_column": label_column,
            "suite": suite,
            "result_format": result_format,
            "task": task,
            "batch_size": batch_size,
            "test_fraction": test_fraction,
            "seed": seed,
        },
        run_id=run_id,
        output=validated.path,
    )
    validated.metadata.update({"md5": result["data_md5"], "rows": result["rows"], "suite": result["suite_name"]})
    copy_file(validated.path + "/" + result["docs_page"], report.path)
