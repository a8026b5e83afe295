"""KFP v2 face of optimize_model: its parameters are the spec's settings (generated); declared here
are its artifacts and what the result puts on them. It returns the variant handed on ('' for none)."""

from typing import Any

from trainpipe.components.optimize_model.spec import NAME, OptimizeModelParams
from trainpipe.faces.kfp_face import Face, In, Out

FIGURES = ("metric", "latency_p50_ms", "throughput_rows_s", "size_bytes")


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> str:
    from trainpipe.faces.kfp_runtime import copy_file, log_metrics

    optimized = artifacts["optimized"]
    optimized.metadata.update(
        {"selected": result["selected"] or "", "reason": result["reason"], "metric": result["metric"]}
    )
    log_metrics(artifacts["metrics"], {f"{v['name']}.{k}": v[k] for v in result["variants"] for k in FIGURES})
    copy_file(optimized.path + "/report.html", artifacts["report"].path)
    return result["selected"] or ""


FACE = Face(
    NAME,
    OptimizeModelParams,
    [
        In("model", "Model"),
        In("data"),
        Out("optimized", "Model", field="output_dir"),
        Out("metrics", "Metrics"),
        Out("report", "HTML"),
        In("calibration_data", optional=True),
    ],
    "Export the model to ONNX, quantize it to int8 and prune it; measure every variant on the held-out rows; "
    "returns the one handed on ('' for none).",
    publish,
    returns="str",
    reads_snapshot=True,
)
optimize_model = FACE.component()
