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
    peak_tflops: float = 0.0,
    tracking_uri: str = "",
    run_id: str = "",
):
    """Throughput, step-time breakdown, skew, memory, MFU and recommendations of the training run, in the KFP UI."""
    from trainpipe.faces.kfp_runtime import copy_file, log_metrics, run_entrypoint

    result = run_entrypoint(
        "profile_training",
        {
            "model": model.path,
            "output_dir": profile.path,
            "warmup_steps": warmup_steps,
            "peak_tflops": peak_tflops or None,
            "tracking_uri": tracking_uri or None,
        },
        run_id=run_id,
    )
    copy_file(profile.path + "/" + result["report"], report.path)
    log_metrics(
        summary,
        {
            "samples_per_second": result["samples_per_second"],
            "step_time_ms": result["step_time_ms"]["mean"],
            "rank_skew": result["rank_skew"],
            "cpu_utilization": result["cpu_utilization"],
            "mfu": result["mfu"],
            **{f"{k}_ms": v for k, v in result["breakdown_ms"].items()},
        },
    )
