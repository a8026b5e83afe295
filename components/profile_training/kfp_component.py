"""KFP v2 face of profile_training: its parameters are the spec's settings (generated); declared here
are its artifacts and what the result puts on them (the KFP UI shows the report and the summary)."""

from typing import Any

from trainpipe.components.profile_training.spec import NAME, ProfileTrainingParams
from trainpipe.faces.kfp_face import Face, In, Out


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> None:
    from trainpipe.faces.kfp_runtime import copy_file, log_metrics

    copy_file(artifacts["training_profile"].path + "/" + result["report"], artifacts["report"].path)
    figures = {k: result[k] for k in ("samples_per_second", "rank_skew", "cpu_utilization", "mfu")}
    phases = {f"{k}_ms": v for k, v in result["breakdown_ms"].items()}
    log_metrics(artifacts["summary"], {**figures, "step_time_ms": result["step_time_ms"]["mean"], **phases})


FACE = Face(
    NAME,
    ProfileTrainingParams,
    [
        Out("training_profile", "Artifact", field="output_dir"),
        Out("report", "HTML"),
        Out("summary", "Metrics"),
        In("model", "Model", optional=True),
        In("data", optional=True),
    ],
    "Throughput, step-time breakdown, skew, memory, MFU and recommendations of a training run (``model``), or of a "
    "short profiling pass on a snapshot (``data`` with ``train`` settings), in the KFP UI.",
    publish,
)
profile_training = FACE.component()
