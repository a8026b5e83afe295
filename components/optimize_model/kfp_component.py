"""KFP v2 face of optimize_model. Holds no logic: it calls the entrypoint.

``optimized`` holds the accepted variant (``model/model.onnx`` + ``model.json``) for register_model,
or no model when none was within ``max_metric_drop``; ``Output`` says which.
"""

from kfp.dsl import HTML, Dataset, Input, Metrics, Model, Output

from trainpipe.faces.kfp_face import component


@component
def optimize_model(
    model: Input[Model],
    data: Input[Dataset],
    optimized: Output[Model],
    metrics: Output[Metrics],
    report: Output[HTML],
    calibration_data: Input[Dataset] = None,
    label_column: str = "label",
    variants: list = ["onnx", "int8_dynamic", "int8_static", "pruned"],
    metric: str = "",
    max_metric_drop: float = 0.005,
    sparsity: float = 0.5,
    pruning: str = "unstructured",
    fine_tune_epochs: int = 2,
    calibration_rows: int = 512,
    onnx_atol: float = 0.001,
    select: str = "throughput",
    threads: int = 1,
    latency_runs: int = 200,
    seed: int = 0,
    dataset_md5: str = "",
    run_id: str = "",
) -> str:
    """Export the model to ONNX, quantize it to int8 and prune it; measure every variant on the held-out rows; returns the one handed on ('' for none)."""
    from trainpipe.faces.kfp_runtime import check_dataset_hash, copy_file, log_metrics, run_entrypoint

    check_dataset_hash(data, dataset_md5)
    result = run_entrypoint(
        "optimize_model",
        {
            "model": model.path,
            "data": data.path,
            "output_dir": optimized.path,
            "calibration_data": calibration_data.path if calibration_data is not None else "",
            "label_column": label_column,
            "variants": variants,
            "metric": metric,
            "max_metric_drop": max_metric_drop,
            "sparsity": sparsity,
            "pruning": pruning,
            "fine_tune_epochs": fine_tune_epochs,
            "calibration_rows": calibration_rows,
            "onnx_atol": onnx_atol,
            "select": select,
            "threads": threads,
            "latency_runs": latency_runs,
            "seed": seed,
        },
        run_id=run_id,
        output=optimized.path,
    )
    optimized.metadata.update(
        {"selected": result["selected"] or "", "reason": result["reason"], "metric": result["metric"]}
    )
    log_metrics(
        metrics,
        {
            f"{v['name']}.{k}": v[k]
            for v in result["variants"]
            for k in ("metric", "latency_p50_ms", "throughput_rows_s", "size_bytes")
        },
    )
    copy_file(optimized.path + "/report.html", report.path)
    return result["selected"] or ""
