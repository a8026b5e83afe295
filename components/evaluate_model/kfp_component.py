"""KFP v2 face of evaluate_model. Holds no logic: it calls the entrypoint.

The gate is data: ``decision`` is an artifact, and the return value (``Output``,
whether the gate passed) is what the pipeline branches on with ``dsl.If``. It is
a single return value, not a named one, because kfp.local resolves conditions
only on a task's ``Output``.
"""

from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from trainpipe.faces.kfp_face import component


@component
def evaluate_model(
    model: Input[Model],
    snapshot: Input[Dataset],
    decision: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[HTML],
    label_column: str = "label",
    thresholds: dict = {"accuracy": 0.8},
    run_id: str = "",
) -> bool:
    """Score the model on its held-out split and decide the gate."""
    from trainpipe.faces.kfp_runtime import copy_file, log_metrics, run_entrypoint

    result = run_entrypoint(
        "evaluate_model",
        {"model": model.path, "data": snapshot.path, "output_dir": decision.path, "label_column": label_column, "thresholds": thresholds},
        run_id=run_id,
    )
    decision.metadata.update({"passed": result["decision"]["passed"], "reasons": result["decision"]["reasons"]})
    log_metrics(metrics, result["metrics"])
    copy_file(decision.path + "/report.html", report.path)
    return bool(result["decision"]["passed"])
