"""KFP v2 face of profile_training. Holds no logic: it calls the entrypoint."""

from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from trainpipe.faces.kfp_face import component


@component
def profile_training(
    profile: Output[Artifact],
    report: Output[HTML],
    summary: Output[Metrics],
    model: Input[Model] = None,
    data: Input[Dataset] = None,
    warmup_steps: int = 3,
    peak_tflops: float = 0.0,
    profile_steps: int = 20,
    train: dict = {},
    tracking_uri: str = "",
    run_id: str = "",
):
    """Throughput, step-time breakdown, skew, memory, MFU and recommendations of a training run (``model``),
    or of a short profiling pass on a snapshot (``data`` with ``train`` settings), in the KFP UI."""
    from trainpipe.faces.kfp_runtime import copy_file, log_metrics, run_entrypoint

    result = run_entrypoint(
        "profile_training",
        {
            "model": model.path if model is not None else "",
            "data": data.path if data is not None else "",
            "output_dir": profile.path,
            "warmup_steps": warmup_steps,
            "peak_tflops": peak_tflops,
            "profile_steps": profile_steps,
            "train": train,
            "tracking_uri": tracking_uri,
        },
        run_id=run_id,
        output=profile.path,
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
