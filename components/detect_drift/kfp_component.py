"""KFP v2 face of detect_drift: its parameters are the spec's settings (generated); declared here are
its artifacts and what the result puts on them. It returns whether to retrain (the pipeline's
``dsl.If`` reads it)."""

from typing import Any

from trainpipe.components.detect_drift.spec import NAME, DetectDriftParams
from trainpipe.faces.kfp_face import Face, In, Out


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> bool:
    from trainpipe.faces.kfp_runtime import copy_file, log_metrics

    shown = ("retrain", "reasons", "dataset_drift", "drifted_columns")
    artifacts["drift"].metadata.update({k: result[k] for k in shown})
    figures = {"share_drifted": result["share_drifted"], "dataset_drift": float(result["dataset_drift"])}
    log_metrics(artifacts["metrics"], {**figures, "retrain": float(result["retrain"])})
    copy_file(artifacts["drift"].path + "/report.html", artifacts["report"].path)
    return bool(result["retrain"])


FACE = Face(
    NAME,
    DetectDriftParams,
    [
        In("data"),
        Out("drift", "Artifact", field="output_dir"),
        Out("metrics", "Metrics"),
        Out("report", "HTML"),
        In("reference", optional=True),
    ],
    "Compare the snapshot with the champion's training data (through its lineage); returns whether to retrain.",
    publish,
    returns="bool",
    reads_snapshot=True,
)
detect_drift = FACE.component()
