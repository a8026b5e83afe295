"""KFP v2 face of evaluate_model. Holds no logic: it calls the entrypoint.

The gate is data: ``decision`` is an artifact, and the return value (``Output``,
whether the gate passed) is what the pipeline branches on with ``dsl.If``. It is
a single return value, not a named one, because kfp.local resolves conditions
only on a task's ``Output``.
"""

from kfp.dsl import HTML, Artifact, ClassificationMetrics, Dataset, Input, Metrics, Model, Output

from trainpipe.faces.kfp_face import component


@component
def evaluate_model(
    model: Input[Model],
    data: Input[Dataset],
    decision: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[HTML],
    classification: Output[ClassificationMetrics],
    label_column: str = "label",
    thresholds: dict = {},
    model_name: str = "",
    champion_alias: str = "champion",
    tracking_uri: str = "",
    min_improvement: dict = {},
    max_regression: dict = {},
    fail_on_gate: bool = False,
    metric_functions: dict = {},
    lower_is_better: list = [],
    dataset_md5: str = "",
    run_id: str = "",
) -> bool:
    """Score the model on its held-out split and decide the gate (thresholds, then the model serving under ``champion_alias``)."""
    from trainpipe.faces.kfp_runtime import check_dataset_hash, copy_file, log_metrics, run_entrypoint

    check_dataset_hash(data, dataset_md5)
    result = run_entrypoint(
        "evaluate_model",
        {
            "model": model.path,
            "data": data.path,
            "output_dir": decision.path,
            "label_column": label_column,
            "thresholds": thresholds,
            "model_name": model_name,
            "champion_alias": champion_alias,
            "tracking_uri": tracking_uri,
            "min_improvement": min_improvement,
            "max_regression": max_regression,
            "fail_on_gate": fail_on_gate,
            "metric_functions": metric_functions,
            "lower_is_better": lower_is_better,
        },
        run_id=run_id,
        output=decision.path,
    )
    decision.metadata.update(
        {"passed": result["decision"]["passed"], "reasons": result["decision"]["reasons"], "task": result["task"]}
    )
    log_metrics(metrics, result["metrics"])
    if result["task"] == "classification":
        classification.log_confusion_matrix([str(c) for c in result["classes"]], result["confusion_matrix"])
        roc = result["roc_curve"]
        classification.log_roc_curve(roc["fpr"], roc["tpr"], roc["thresholds"])
    copy_file(decision.path + "/report.html", report.path)
    return bool(result["decision"]["passed"])
