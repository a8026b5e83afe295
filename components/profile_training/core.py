"""profile_training: the work. Reads the per-rank telemetry train_model recorded.

Reading a finished run's telemetry needs no training stack: the training modules are imported only by the
profiling pass (``data`` given), matplotlib only by the charts (its ``Figure`` and Agg canvas, not pyplot),
MLflow only where the summary is logged."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import statistics
from itertools import pairwise
from pathlib import Path
from typing import Any

from trainpipe.components.profile_training.spec import (
    NAME,
    REPORT_FILE,
    SUMMARY_FILE,
    TRACE_FILE,
    ProfileTrainingConfig,
    ProfileTrainingResult,
)
from trainpipe.contract import errors
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_copy, atomic_write_json, atomic_write_settings, atomic_write_text
from trainpipe.contract.layout import ERRORS_DIR, MARKER, MODEL_META, TELEMETRY_DIR
from trainpipe.contract.lineage import Lineage, TrainingProfileLineage
from trainpipe.contract.policy import Policy
from trainpipe.contract.runtime import Runtime

#: Step phases in the order they happen. The torch backends time forward, backward and
#: optimizer apart; TensorFlow runs them in one tf.function, reported as ``compute``.
#: ``other`` is the loop's bookkeeping, metric sync and checkpoint writes.
PHASES = ("data", "forward", "backward", "optimizer", "compute", "other")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def load_telemetry(model_dir: str | Path) -> list[dict[str, Any]]:
    """Per-rank telemetry of a training run, ordered by rank.

    Raises:
        InputError: the artifact has no telemetry (not a train_model output).
    """
    files = sorted(Path(model_dir, TELEMETRY_DIR).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    if not files:
        raise InputError(f"model: {str(model_dir)!r} holds no training telemetry ({TELEMETRY_DIR}/rank*.json)")
    return [json.loads(f.read_text(encoding="utf-8")) for f in files]


#: Peak dense TFLOP/s per GPU by precision (vendor data sheets, SXM parts where both exist).
#: ``peak_tflops`` in the config overrides; CPUs are estimated from cores, clock and vector width.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"fp32": 67.0, "bf16": 989.0, "fp16": 989.0},
    "H100": {"fp32": 67.0, "bf16": 989.0, "fp16": 989.0},
    "A100": {"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "bf16": 362.0, "fp16": 362.0},
    "A10": {"fp32": 31.2, "bf16": 125.0, "fp16": 125.0},
    "L4": {"fp32": 30.3, "bf16": 121.0, "fp16": 121.0},
    "V100": {"fp32": 15.7, "bf16": 15.7, "fp16": 125.0},
    "T4": {"fp32": 8.1, "bf16": 8.1, "fp16": 65.0},
}


def cpu_peak_tflops(cpus: int) -> tuple[float, str]:
    """fp32 vector peak of ``cpus`` cores: cores x clock x FLOPs per cycle (2 FMA units: AVX-512 64,
    AVX2 32, else 8)."""
    flags, mhz = "", 0.0
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("flags") and not flags:
                flags = line
            elif line.startswith("cpu MHz") and not mhz:
                mhz = float(line.split(":")[1])
    except OSError:
        pass
    per_cycle = 64 if " avx512f" in flags else 32 if " avx2" in flags else 8
    ghz = (mhz or 2000.0) / 1000.0
    return cpus * ghz * per_cycle / 1000.0, f"CPU estimate: {cpus} cores x {ghz:.2f} GHz x {per_cycle} FLOP/cycle"


def flops_per_sample(meta: dict[str, Any]) -> float | None:
    """Training FLOPs per sample of the built-in nets: 3x the forward multiply-adds x 2. A team's
    model gets them from torch.profiler's count when a window was traced (``profile_steps``)."""
    builder, args = meta.get("builder"), meta.get("init_args") or {}
    if builder == "builtin:mlp":
        widths = [int(args["features"]), *args.get("hidden_units", []), int(args["n_outputs"])]
        forward = sum(2 * a * b for a, b in pairwise(widths))
    elif builder == "builtin:cnn":
        c, h, w = args["image_shape"]
        forward = 2 * (
            c * 16 * 9 * h * w + 16 * 32 * 9 * h * w + 32 * (h // 2) * (w // 2) * 64 + 64 * int(args["n_outputs"])
        )
    else:
        return None
    return 3.0 * forward


def summarize(
    ranks: list[dict[str, Any]], warmup_steps: int, meta: dict[str, Any] | None = None, peak_tflops: float | None = None
) -> dict[str, Any]:
    """Steady-state figures from per-rank step records.

    Throughput is the sum over ranks of samples / time spent in steps (ranks run in
    parallel); the breakdown is the mean per-step time of each phase, and the phases
    add up to the step time. MFU is achieved training FLOP/s over the peak of the
    devices the ranks ran on.
    """
    shortest = min((len(r["steps"]) for r in ranks), default=0)
    if shortest == 0:
        raise InputError("data: the training recorded no step on some rank, so there is nothing to profile")
    if warmup_steps >= shortest:  # a short run (small data) is profiled on what it has, never failed for it
        import sys

        print(
            f"trainpipe profile_training: warmup_steps: {warmup_steps} would leave no steady-state step on a rank of "
            f"{shortest} steps: the first {shortest - 1} are left out instead",
            file=sys.stderr,
        )
        warmup_steps = shortest - 1
    steady = [r["steps"][warmup_steps:] for r in ranks]
    all_steps = [s for rank in steady for s in rank]
    step_times = [s["step_s"] for s in all_steps]
    per_rank_mean = [statistics.fmean(s["step_s"] for s in rank) for rank in steady]
    throughput = sum(sum(s["samples"] for s in rank) / sum(s["step_s"] for s in rank) for rank in steady)
    breakdown = {p: 1000 * statistics.fmean(s[f"{p}_s"] for s in all_steps) for p in PHASES if f"{p}_s" in all_steps[0]}
    threads = int(ranks[0].get("threads") or 1)
    cpu_util = (
        statistics.fmean(
            min(1.0, r["cpu_s"] / max(r["wall_s"], 1e-9) / threads) for r in ranks if r.get("cpu_s") is not None
        )
        if ranks[0].get("cpu_s") is not None
        else float("nan")
    )
    device = str(ranks[0].get("device", "cpu"))
    on_gpu = device.startswith("cuda")
    fps = flops_per_sample(meta or {})
    prof = ranks[0].get("profiler") or None
    if fps is None and prof and prof.get("flops_per_step"):
        fps = prof["flops_per_step"] / max(1, ranks[0]["steps"][0]["samples"])
    precision = str(ranks[0].get("precision", "fp32"))
    peak, source = None, ""
    if peak_tflops:
        peak, source = peak_tflops * len(ranks) if on_gpu else peak_tflops, "configured"
    elif on_gpu:
        name = str(ranks[0].get("device_name", ""))
        known = next((k for k in PEAK_TFLOPS if k in name.upper()), None)
        if known:
            peak, source = PEAK_TFLOPS[known][precision] * len(ranks), f"{known} {precision} x {len(ranks)}"
    else:
        cpus = int(ranks[0].get("usable_cpus") or threads * len(ranks))
        peak, source = cpu_peak_tflops(cpus)
    achieved = fps * throughput / 1e12 if fps else None
    window = None
    if prof:
        first, n = int(prof["first_step_index"]), int(prof["steps"])
        traced = ranks[0]["steps"][first : first + n]
        if traced:
            window = {
                "first_step_index": first,
                "steps": len(traced),
                "step_time_ms": 1000 * statistics.fmean(s["step_s"] for s in traced),
                "samples_per_second": len(ranks) * sum(s["samples"] for s in traced) / sum(s["step_s"] for s in traced),
            }
    return {
        "world_size": len(ranks),
        "steps": len(all_steps),
        "samples_per_second": throughput,
        "step_time_ms": {
            "mean": 1000 * statistics.fmean(step_times),
            "p50": 1000 * _percentile(step_times, 0.5),
            "p95": 1000 * _percentile(step_times, 0.95),
        },
        "breakdown_ms": breakdown,
        "rank_skew": max(per_rank_mean) / min(per_rank_mean),
        "peak_rss_mb": {str(r["rank"]): round(r["peak_rss_mb"], 1) for r in ranks},
        "peak_device_mb": {str(r["rank"]): r.get("peak_device_mb") for r in ranks},
        "threads_per_rank": threads,
        "cpu_utilization": cpu_util,
        "device": f"{device} ({ranks[0].get('device_name', '')})",
        "flops_per_sample": fps,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "peak_source": source,
        "mfu": (achieved / peak) if achieved and peak else None,
        "collective_ms_per_step": prof.get("collective_ms_per_step") if prof else None,
        "gpu_utilization_pct": {str(r["rank"]): (r.get("gpu") or {}).get("utilization_pct_mean") for r in ranks}
        if on_gpu
        else None,
        "profiled_window": window,
    }


def recommend(summary: dict[str, Any], ranks: list[dict[str, Any]]) -> list[str]:
    """Concrete advice for the causes the figures show."""
    out: list[str] = []
    step = summary["step_time_ms"]["mean"]
    b = summary["breakdown_ms"]
    data_share = b.get("data", 0.0) / step if step else 0.0
    r0 = ranks[0]
    on_gpu = str(r0.get("device", "")).startswith("cuda")
    rows_on = r0.get("rows_on")
    busy = [v for v in (summary.get("gpu_utilization_pct") or {}).values() if v is not None]
    host_bound = on_gpu and step < 10 and ((rows_on == "device" and data_share > 0.2) or (busy and min(busy) < 80))
    if host_bound:
        gpu = f", the GPU busy {min(busy):.0f}% of the time" if busy else ""
        out.append(
            f"The step ({step:.2f} ms{gpu}) is bound by the host, not the GPU: Python and kernel launches set its pace "
            f"({'the rows are already on the device, so ' if rows_on == 'device' else ''}background data workers "
            "will not help). A larger batch (and learning rate), fewer Python calls per step (log fewer values, fuse "
            "small ops), torch.compile or CUDA graphs do."
        )
    elif data_share > 0.2 and rows_on != "device":
        out.append(
            f"Data loading takes {data_share:.0%} of each step: load batches in background workers "
            "(DataLoader num_workers > 0, persistent_workers), pin host memory (pin_memory=True) and prefetch onto the "
            "device."
        )
    cpus, local = int(r0.get("usable_cpus") or 0), int(r0.get("local_world") or summary["world_size"])
    if cpus and summary["threads_per_rank"] * local > cpus:
        out.append(
            f"Threads are oversubscribed: {local} ranks x {summary['threads_per_rank']} threads on {cpus} usable CPUs; "
            "leave OMP_NUM_THREADS unset (trainpipe then gives each rank usable_cpus // ranks) or run fewer ranks."
        )
    per_rank_batch = int(r0["steps"][0]["samples"]) if r0.get("steps") else 0
    if not host_bound and ((on_gpu and step < 10) or (not on_gpu and step < 2)):
        out.append(
            f"Steps take {step:.2f} ms with {per_rank_batch} samples per rank: fixed per-step costs (Python, kernel "
            "launches, "
            "all-reduce latency) dominate; raise batch_size (and the learning rate with it) to use the device."
        )
    comm = summary.get("collective_ms_per_step")
    if comm and step and comm / step > 0.3:
        out.append(
            f"Collectives take {comm / step:.0%} of the step time: the job is communication-bound; use NCCL on GPUs, "
            "larger gradient buckets or gradient accumulation, fewer ranks per node, or a faster interconnect."
        )
    if summary["rank_skew"] > 1.25:
        out.append(
            f"The slowest rank's steps are {summary['rank_skew']:.2f}x the fastest's: look for a straggler (noisy "
            "neighbour, uneven data, thermal throttling)."
        )
    other = b.get("other", 0.0)
    if step and other / step > 0.25:
        out.append(
            f"{other / step:.0%} of the step time is outside the model (metric sync, checkpoint writes): checkpoint "
            "less often (checkpoint_every_steps)."
        )
    if on_gpu and summary.get("mfu") is not None and summary["mfu"] < 0.05:
        out.append(
            f"MFU is {summary['mfu']:.1%}: the model is too small for the device or the input pipeline starves it; try "
            "bf16 and larger batches."
        )
    return out


def _subplots(figsize: tuple[float, float]) -> tuple[Any, Any]:
    """A figure and its axes drawn by the Agg canvas, without pyplot (its import and figure registry); the PNG
    is the one ``plt.subplots`` would give."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _charts(ranks: list[dict[str, Any]], summary: dict[str, Any]) -> list[tuple[str, str]]:
    charts = []
    fig, ax = _subplots((7, 3))
    for r in ranks:
        ax.plot([s["samples"] / s["step_s"] for s in r["steps"]], label=f"rank {r['rank']}", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("samples/s per rank")
    ax.legend()
    charts.append(("Throughput over steps", fig))
    fig, ax = _subplots((7, 2.2))
    left = 0.0
    for phase, v in summary["breakdown_ms"].items():
        ax.barh([0], [v], left=left, label=phase)
        left += v
    ax.set_yticks([])
    ax.set_xlabel("mean ms per step")
    ax.legend(ncol=6, fontsize="small")
    charts.append(("Step-time breakdown", fig))
    fig, ax = _subplots((7, 2.6))
    means = [1000 * statistics.fmean(s["step_s"] for s in r["steps"][min(3, len(r["steps"]) - 1) :]) for r in ranks]
    ax.bar([f"rank {r['rank']}" for r in ranks], means)
    ax.set_ylabel("mean step ms")
    charts.append(("Per-rank step time (skew)", fig))
    out = []
    for title, fig in charts:
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=90)
        out.append((title, base64.b64encode(buf.getvalue()).decode("ascii")))
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, dict):
        return json.dumps({k: round(x, 3) if isinstance(x, float) else x for k, x in v.items()})
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:,.4g}"
    return "n/a" if v is None else str(v)


def render_report(summary: dict[str, Any], charts: list[tuple[str, str]], recommendations: list[str]) -> str:
    """A self-contained HTML page (charts inlined), viewable in the KFP UI."""
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in summary.items())
    recs = "".join(f"<li>{html.escape(r)}</li>" for r in recommendations) or "<li>No bottleneck stands out.</li>"
    imgs = "".join(
        f'<figure><img alt="{html.escape(t)}" '
        f'src="data:image/png;base64,{b}"><figcaption>{html.escape(t)}</figcaption></figure>'
        for t, b in charts
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>trainpipe training profile</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left}</style></head>"
        f"<body><h1>Training profile</h1><h2>Recommendations</h2><ul id='recommendations'>{recs}</ul>"
        f"<h2>Summary</h2><table id='summary'>{rows}</table>{imgs}</body></html>\n"
    )


def profiling_pass(config: ProfileTrainingConfig, out: Path) -> Path:
    """Run a short training pass (warm-up + ``profile_steps`` steps, no MLflow run) and return its output directory."""
    from trainpipe.contract.config import build
    from trainpipe.training import launch
    from trainpipe.training.preflight import check_inputs, rank_env
    from trainpipe.training.settings import TrainModelConfig

    run_dir = out / "pass"
    settings = {
        **config.train,
        "data": config.data,
        "output_dir": str(run_dir),
        "checkpoint_dir": str(run_dir / ".ckpt"),
    }
    settings.update(
        {
            "max_steps": config.warmup_steps + 5 + config.profile_steps,
            "epochs": 10_000,
            "checkpoint_every_steps": 0,
            "checkpoint_every_s": 0,
        }
    )
    settings["profile_steps"] = config.profile_steps
    train_cfg = build(TrainModelConfig, settings, where="train")
    check_inputs(train_cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / ".train_config.json"
    atomic_write_settings(cfg_path, train_cfg)
    code = launch.launch(train_cfg, cfg_path, rank_env(train_cfg), run_dir / ERRORS_DIR)
    if code != 0:
        reported = launch.permanent_error(run_dir / ERRORS_DIR)
        if reported is not None:
            raise getattr(errors, reported.get("type", ""), errors.TrainpipeError)(reported["message"])
        if code == errors.EXIT_TRANSIENT:
            raise errors.Preempted("profiling pass: preempted (SIGTERM or SIGUSR1); a retry runs it again")
        raise errors.TrainpipeError(f"profiling pass: the training ranks exited with {code}")
    return run_dir


def _log_to_mlflow(
    config: ProfileTrainingConfig, run_id: str, summary: dict[str, Any], out: Path, policy: Policy
) -> None:
    from trainpipe.services import tracking

    client = tracking.connect(config.tracking_uri, policy)
    tracking.prepare_artifact_store(client, policy, run_id)
    for key in (
        "samples_per_second",
        "rank_skew",
        "cpu_utilization",
        "mfu",
        "achieved_tflops",
        "collective_ms_per_step",
        "cost_per_epoch",
        "cost_per_1k_samples",
    ):
        value = summary.get(key)
        if isinstance(value, (int, float)) and not math.isnan(value):
            client.log_metric(run_id, f"profile_{key}", float(value))
    client.log_metric(run_id, "profile_step_time_ms", summary["step_time_ms"]["mean"])
    for phase, ms in summary["breakdown_ms"].items():
        client.log_metric(run_id, f"profile_{phase}_ms", ms)
    for name in (SUMMARY_FILE, REPORT_FILE, TRACE_FILE):
        if (out / name).exists():
            client.log_artifact(run_id, str(out / name), artifact_path="profile_training")


def costs_of(source: Path, samples_per_second: float) -> dict[str, Any]:
    """What the profiled training cost (train_model's result, on a priced hardware profile): in all, per
    epoch, and per thousand samples at the steady-state throughput; empty when it was not priced."""
    try:
        trained = json.loads((source / MARKER).read_text(encoding="utf-8")).get("result") or {}
    except (OSError, ValueError):
        return {}
    cost, usage = trained.get("cost"), trained.get("usage") or {}
    if not isinstance(cost, (int, float)):
        return {}
    wall, epochs = usage.get("wall_seconds") or 0.0, trained.get("epochs") or 0
    per_second = cost / wall if wall > 0 else None
    return {
        "cost": cost,
        "currency": trained.get("currency"),
        "cost_per_epoch": float(f"{cost / epochs:.6g}") if epochs else None,  # six significant digits
        "cost_per_1k_samples": (
            float(f"{per_second * 1000 / samples_per_second:.6g}") if per_second and samples_per_second > 0 else None
        ),
    }


def profile_training(
    config: ProfileTrainingConfig, lineage: Lineage, runtime: Runtime | None = None
) -> ProfileTrainingResult:
    """Measure a training run: throughput, breakdown, skew, memory, CPU use, MFU, a trace and advice.

    Reads a finished run's telemetry (``model``), or runs a short profiling pass on a
    snapshot first (``data``). Writes ``summary.json``, ``report.html`` and, when
    torch.profiler traced the run, ``trace.json`` (Chrome trace); logs the summary to
    the training run in MLflow when one is known (under ``runtime``'s policy).

    Raises:
        InputError: the artifact has no usable telemetry.
        ServiceUnavailable: MLflow cannot be reached.
    """
    out = Path(config.output_dir)
    source = Path(config.model) if config.model else profiling_pass(config, out)
    ranks = load_telemetry(source)
    meta_path = source / MODEL_META
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else None
    summary = summarize(ranks, config.warmup_steps, meta, config.peak_tflops)
    summary.update(costs_of(source, summary["samples_per_second"]))
    recommendations = recommend(summary, ranks)
    trace = None
    prof = ranks[0].get("profiler")
    if prof and prof.get("trace") and (source / TELEMETRY_DIR / prof["trace"]).exists():
        atomic_copy(source / TELEMETRY_DIR / prof["trace"], out / TRACE_FILE)
        trace = TRACE_FILE
    atomic_write_json(out / SUMMARY_FILE, {**summary, "recommendations": recommendations})
    atomic_write_text(out / REPORT_FILE, render_report(summary, _charts(ranks, summary), recommendations))
    lineage = Lineage.of(lineage)
    run_id = lineage.training.mlflow_run_id if config.model and lineage.training else None
    if run_id and (config.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")):
        _log_to_mlflow(config, run_id, summary, out, (runtime or Runtime()).policy)
    result = ProfileTrainingResult(**summary, recommendations=recommendations, trace=trace, mlflow_run_id=run_id)
    result.lineage = lineage.with_(
        training_profile=TrainingProfileLineage(
            samples_per_second=round(result.samples_per_second, 1),
            step_time_ms=round(result.step_time_ms["mean"], 3),
            world_size=result.world_size,
            mfu=round(result.mfu, 6) if result.mfu is not None else None,
            recommendations=len(recommendations),
            cost_per_epoch=result.cost_per_epoch,
            cost_per_1k_samples=result.cost_per_1k_samples,
            currency=result.currency,
        )
    )
    return result


__all__ = ["NAME", "profile_training", "recommend", "summarize"]
