"""profile_training: the work. Reads the per-rank telemetry train_model recorded."""

from __future__ import annotations

import base64
import html
import io
import json
import statistics
from pathlib import Path
from typing import Any

from trainpipe.components.profile_training.spec import (
    NAME,
    REPORT_FILE,
    SUMMARY_FILE,
    ProfileTrainingConfig,
    ProfileTrainingResult,
)
from trainpipe.components.train_model.spec import TELEMETRY_DIR
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json, atomic_write_text

#: Step phases in the order they happen. The torch backends time forward, backward and
#: optimizer apart; TensorFlow runs them in one tf.function, reported as ``compute``.
PHASES = ("data", "forward", "backward", "optimizer", "compute")


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


def summarize(ranks: list[dict[str, Any]], warmup_steps: int) -> dict[str, Any]:
    """Steady-state figures from per-rank step records.

    Throughput is the sum over ranks of samples / time spent in steps (ranks run
    in parallel); the breakdown is the mean per-step time of each phase.
    """
    steady = [r["steps"][warmup_steps:] for r in ranks]
    if not all(steady):
        raise InputError(f"warmup_steps: {warmup_steps} leaves no steady-state steps to measure on some rank")
    all_steps = [s for rank in steady for s in rank]
    step_times = [s["step_s"] for s in all_steps]
    per_rank_mean = [statistics.fmean(s["step_s"] for s in rank) for rank in steady]
    throughput = sum(sum(s["samples"] for s in rank) / sum(s["step_s"] for s in rank) for rank in steady)
    return {
        "world_size": len(ranks),
        "steps": len(all_steps),
        "samples_per_second": throughput,
        "step_time_ms": {
            "mean": 1000 * statistics.fmean(step_times),
            "p50": 1000 * _percentile(step_times, 0.5),
            "p95": 1000 * _percentile(step_times, 0.95),
        },
        "breakdown_ms": {p: 1000 * statistics.fmean(s[f"{p}_s"] for s in all_steps) for p in PHASES if f"{p}_s" in all_steps[0]},
        "rank_skew": max(per_rank_mean) / min(per_rank_mean),
        "peak_rss_mb": {str(r["rank"]): round(r["peak_rss_mb"], 1) for r in ranks},
        "peak_device_mb": {str(r["rank"]): r.get("peak_device_mb") for r in ranks},
        "threads_per_rank": int(ranks[0].get("threads", 1)),
    }


def _charts(ranks: list[dict[str, Any]], summary: dict[str, Any]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    charts = []
    fig, ax = plt.subplots(figsize=(7, 3))
    for r in ranks:
        ax.plot([1000 * s["step_s"] for s in r["steps"]], label=f"rank {r['rank']}", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.legend()
    fig.tight_layout()
    charts.append(("Step time per rank", fig))
    fig, ax = plt.subplots(figsize=(7, 2.2))
    left = 0.0
    for phase, v in summary["breakdown_ms"].items():
        ax.barh([0], [v], left=left, label=phase)
        left += v
    ax.set_yticks([])
    ax.set_xlabel("mean ms per step")
    ax.legend(ncol=4, fontsize="small")
    fig.tight_layout()
    charts.append(("Step-time breakdown", fig))
    out = []
    for title, fig in charts:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        out.append((title, base64.b64encode(buf.getvalue()).decode("ascii")))
    return out


def render_report(summary: dict[str, Any], charts: list[tuple[str, str]]) -> str:
    """A self-contained HTML page (charts inlined), viewable in the KFP UI."""
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(v) if isinstance(v, dict) else f'{v:,.3f}' if isinstance(v, float) else str(v))}</td></tr>"
        for k, v in summary.items()
    )
    imgs = "".join(f'<h2>{html.escape(t)}</h2><img alt="{html.escape(t)}" src="data:image/png;base64,{b}">' for t, b in charts)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>trainpipe training profile</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left}</style></head>"
        f"<body><h1>Training profile</h1><table>{rows}</table>{imgs}</body></html>\n"
    )


def profile_training(config: ProfileTrainingConfig, lineage: dict[str, Any]) -> ProfileTrainingResult:
    """Summarize a training run's measured performance as JSON and an HTML report.

    Args:
        config: Settings and paths.
        lineage: The lineage so far; ``profile`` is added.

    Returns:
        Throughput, step-time statistics, breakdown and peak memory.

    Raises:
        InputError: the artifact has no usable telemetry.
    """
    ranks = load_telemetry(config.model)
    summary = summarize(ranks, config.warmup_steps)
    out = Path(config.output_dir)
    atomic_write_json(out / SUMMARY_FILE, summary)
    atomic_write_text(out / REPORT_FILE, render_report(summary, _charts(ranks, summary)))
    result = ProfileTrainingResult(**summary)
    lineage = dict(lineage)
    lineage["profile"] = {
        "samples_per_second": round(result.samples_per_second, 1),
        "step_time_ms": round(result.step_time_ms["mean"], 3),
        "world_size": result.world_size,
    }
    result.lineage = lineage
    return result


__all__ = ["NAME", "profile_training", "summarize"]
