"""KFP v2 face of profile_training. Holds no logic: it calls the entrypoint."""

from kfp.dsl import HTML, Artifact, Input, Metrics, Model, Output

from trainpipe.faces.kfp_face import component


@component
def profile_training(
    model: Input[Model],
    profile: Output[Artifact],
    report: Output[HTML],
    summary: Output[Metrics],
    warmup_steps: int = 3,
    run_id: str = "",
):
    """Throughput, step-time breakdown and memory of the training run, shown in the KFP UI."""
    from trainpipe.faces.kfp_runtime import copy_file, log_metrics, run_entrypoint

    result = run_entrypoint(
        "profile_training", {"model": model.path, "output_dir": profile.path, "warmup_steps": warmup_steps}, run_id=run_id
    )
    copy_file(profile.path + "/" + result["report"], report.path)
    log_metrics(summary, {"samples_per_second": result["samples_per_second"], "step_time_ms": result["step_time_ms"]["mean"], "rank_skew": result["rank_skew"]})
