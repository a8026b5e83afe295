"""KFP v2 face of evaluate_model: its parameters are the spec's settings (generated); declared here
are its artifacts and what the result puts on them. It returns whether the gate passed (the
pipeline's ``dsl.If`` reads it)."""

from typing import Any

from trainpipe.components.evaluate_model.spec import NAME, EvaluateModelParams
from trainpipe.faces.kfp_face import Face, In, Out


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> bool:
    from trainpipe.faces.kfp_runtime import copy_file, log_metrics

    decision = result["decision"]
    artifacts["decision"].metadata.update(
        {"passed": decision["passed"], "reasons": decision["reasons"], "task": result["task"]}
    )
    log_metrics(artifacts["metrics"], result["metrics"])
    if result["task"] == "classification":
        classification = artifacts["classification"]
        classification.log_confusion_matrix([str(c) for c in result["classes"]], result["confusion_matrix"])
        roc = result["roc_curve"]
        classification.log_roc_curve(roc["fpr"], roc["tpr"], roc["thresholds"])
    copy_file(artifacts["decision"].path + "/report.html", artifacts["report"].path)
    return bool(decision["passed"])


FACE = Face(
    NAME,
    EvaluateModelParams,
    [
        In("model", "Model"),
        In("data"),
        Out("decision", "Artifact", field="output_dir"),
        Out("metrics", "Metrics"),
        Out("report", "HTML"),
        Out("classification", "ClassificationMetrics"),
    ],
    "Score the model on its held-out split and decide the gate (thresholds, then the model serving under ``alias``).",
    publish,
    returns="bool",
    reads_snapshot=True,
)
evaluate_model = FACE.component()
