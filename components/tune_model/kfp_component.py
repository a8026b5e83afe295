"""KFP v2 face of tune_model: its parameters are the spec's settings (generated); declared here are
its artifacts and what the result puts on them. Several workers on one study: a ``dsl.ParallelFor``
of this component with ``summarize=False``, then one with ``summarize=True`` after them."""

from typing import Any

from trainpipe.components.tune_model.spec import NAME, TuneModelParams
from trainpipe.faces.kfp_face import Face, In, Out


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> None:
    from pathlib import Path

    from trainpipe.faces.kfp_runtime import copy_file, log_metrics

    shown = ("study_name", "best_trial", "best_params", "complete", "pruned", "failed")
    artifacts["study"].metadata.update({k: result[k] for k in shown})
    figures = {f"best_{o}": v for o, v in zip(result["objectives"], result["best_values"], strict=False)}
    log_metrics(artifacts["metrics"], {**figures, "trials_here": float(result["ran_here"])})
    report = Path(artifacts["study"].path) / "report.html"
    if report.is_file():
        copy_file(str(report), artifacts["report"].path)
    else:  # a parallel worker: the join step writes the report
        Path(artifacts["report"].path).write_text(
            f"<p>worker of study {result['study_name']}: {result['ran_here']} trials; the report step summarizes.</p>"
        )


FACE = Face(
    NAME,
    TuneModelParams,
    [
        In("data"),
        Out("study", "Artifact", field="output_dir"),
        Out("metrics", "Metrics"),
        Out("report", "HTML"),
    ],
    "Search train_model's settings with Optuna; trials are real trainings scored on validation rows.",
    publish,
    reads_snapshot=True,
)
tune_model = FACE.component()
