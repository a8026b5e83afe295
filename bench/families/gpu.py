"""Where CUDA is present: train_model on one GPU against a strong bare loop (bench/baselines/bare_gpu.py:
every row on the device, batches gathered there, no synchronization in the loop), on the issue's
two shapes in bf16 with digits repeated 256 times (460k rows): whole-run samples/s at default
settings; the median step with a checkpoint every 30 s against none, and the loop's wait per
checkpoint against a copy of the same state to pinned host memory; MFU as profile_training
reports it against what the FLOPs count gives at the same run's speed. The data is a raw CSV and
tracking a SQLite file, so a GPU machine needs neither DVC nor Great Expectations
(../shared/gpu/README.md). Skipped, with the reason noted, where CUDA is absent: `make bench`
never fails for lack of a GPU.

TRAINPIPE_BENCH_GPU_SECONDS (default 75) is how long the checkpoint comparison trains, so that
a checkpoint every 30 s happens at least twice; 0 leaves the comparison out (a short device check).
TRAINPIPE_BENCH_GPU_SHAPES (default ``wide,narrow``; ``tiny`` too) picks the throughput shapes, and
TRAINPIPE_BENCH_GPU_EPOCHS, when set, trains each that many epochs instead of its own.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

from bench.common import BASELINES, PROBES, PY, Bench, alternate, digits, result, row, sh, steady_sps, train

SKIPPED = "skipped: no CUDA device on this machine (the GPU rows run where one is present)"
COPIES = 256
#: name -> (hidden units, batch, epochs for the throughput runs)
SHAPES = {"wide": ([8192, 8192, 8192], 8192, 20), "narrow": ([4096, 4096], 4096, 40), "tiny": ([256], 256, 4)}
DEFAULT_SHAPES = "wide,narrow"
LR = 0.05


def cuda_devices() -> int:
    return int(
        sh(PY, "-c", "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")[1].strip()
    )


def shape_name(hidden: list[int], batch: int) -> str:
    return f"MLP 64-{'-'.join(map(str, hidden))}-10, batch {batch}, bf16, 1 GPU, digits ×{COPIES}"


def run(b: Bench) -> list[dict[str, Any]]:
    if not cuda_devices():
        b.note("gpu", SKIPPED)
        print(f"gpu: {SKIPPED}", file=sys.stderr)
        return []
    csv = b.work / f"digits-x{COPIES}.csv"
    if not csv.exists():
        digits(csv, COPIES)
    rows, notes = [], {}
    chosen = [n for n in os.environ.get("TRAINPIPE_BENCH_GPU_SHAPES", DEFAULT_SHAPES).split(",") if n]
    if unknown := [n for n in chosen if n not in SHAPES]:
        raise ValueError(f"TRAINPIPE_BENCH_GPU_SHAPES: unknown shape {unknown[0]!r} (known: {', '.join(SHAPES)})")
    for name in chosen:
        hidden, batch, epochs = SHAPES[name]
        epochs = int(os.environ.get("TRAINPIPE_BENCH_GPU_EPOCHS") or epochs)
        rows.append(throughput(b, csv, name, hidden, batch, epochs, notes))
    if "wide" in chosen and float(os.environ.get("TRAINPIPE_BENCH_GPU_SECONDS", 75)) > 0:
        rows += checkpoints(b, csv, *SHAPES["wide"][:2], notes)
    else:
        rows += [notes[n].pop("mfu_row") for n in chosen]
    b.note("gpu", notes)
    return rows


def _bare(csv: Any, hidden: list[int], batch: int, epochs: int) -> dict[str, Any]:
    _, out = sh(
        PY,
        str(BASELINES / "bare_gpu.py"),
        str(csv),
        "label",
        str(epochs),
        str(batch),
        str(LR),
        "0",
        ",".join(map(str, hidden)),
        "bf16",
        env={"PYTHONPATH": str(BASELINES)},
    )
    return result(out)


def _ours(b: Bench, csv: Any, out: str, hidden: list[int], batch: int, epochs: int, **extra: Any) -> tuple[dict, dict]:
    _, r, tele, _ = train(
        b.work,
        csv,
        out,
        1,
        batch,
        epochs,
        train_config={"hidden_units": hidden, "learning_rate": LR},
        device="cuda",
        precision="bf16",
        **extra,
    )
    return r, tele


def throughput(
    b: Bench, csv: Any, name: str, hidden: list[int], batch: int, epochs: int, notes: dict[str, Any]
) -> dict[str, Any]:
    """Whole-run samples/s at default settings against the bare loop, and the MFU profile_training reports."""
    from trainpipe.components.profile_training.core import load_telemetry, summarize

    bare_runs, our_runs = [], []

    def base() -> float:
        bare_runs.append(_bare(csv, hidden, batch, epochs))
        return bare_runs[-1]["samples_per_second"]

    def ours() -> float:
        r, tele = _ours(b, csv, f"gpu-{name}", hidden, batch, epochs)
        meta = json.loads((b.work / f"gpu-{name}" / "model.json").read_text())
        summary = summarize(load_telemetry(b.work / f"gpu-{name}"), 5, meta)
        our_runs.append(
            {
                "sps": steady_sps(tele),
                "median_step_s": statistics.median(s["step_s"] for s in tele["steps"][5:]),
                "profile": summary,
                "rows_on": tele.get("rows_on"),
                "torch": tele.get("torch"),
            }
        )
        return our_runs[-1]["sps"]

    bs, os_ = alternate(base, ours, b.repeats)
    fps = bare_runs[-1]["flops_per_sample"]
    last = our_runs[-1]["profile"]
    counted = [
        fps * r["sps"] / 1e12 / r["profile"]["peak_tflops"] for r in our_runs
    ]  # what the FLOPs count gives at train_model's own speed
    notes[name] = {
        "device": bare_runs[-1]["device_name"],
        "torch": our_runs[-1]["torch"],
        "rows_on": our_runs[-1]["rows_on"],
        "median_step_ms": {
            "bare": round(1000 * statistics.median(r["median_step_s"] for r in bare_runs), 3),
            "train_model": round(1000 * statistics.median(r["median_step_s"] for r in our_runs), 3),
        },
        "mfu": {
            "bare (FLOPs count)": round(bare_runs[-1]["achieved_tflops"] / last["peak_tflops"], 4),
            "train_model (profile_training)": round(last["mfu"], 4),
            "train_model (FLOPs count)": round(counted[-1], 4),
        },
        "achieved_tflops": {
            "bare": round(bare_runs[-1]["achieved_tflops"], 1),
            "train_model": round(last["achieved_tflops"], 1),
        },
        "peak": f"{last['peak_tflops']:.0f} TFLOP/s ({last['peak_source']})",
    }
    reported = [r["profile"]["mfu"] for r in our_runs]
    notes[name]["mfu_row"] = row(
        f"MFU profile_training reports for train_model ({shape_name(hidden, batch)})",
        "the FLOPs count at the same run's samples/s",
        "MFU",
        counted,
        reported,
        "1 ± 0.05",
        True,
        lambda r, *_: 0.95 <= r <= 1.05,
    )
    return row(
        f"train_model at default settings, whole run ({shape_name(hidden, batch)})",
        "a strong bare GPU loop (rows on the device, no sync)",
        "samples/s",
        bs,
        os_,
        "≥ 0.95",
        True,
        lambda r, *_: r >= 0.95,
    )


def checkpoints(b: Bench, csv: Any, hidden: list[int], batch: int, notes: dict[str, Any]) -> list[dict[str, Any]]:
    """A checkpoint every 30 s against none, on a run long enough for two; the loop's wait per
    checkpoint against a plain copy of the same state to pinned host memory."""
    seconds = float(os.environ.get("TRAINPIPE_BENCH_GPU_SECONDS", 75))
    per_epoch = notes["wide"]["median_step_ms"]["train_model"] / 1000 * (int(460_000 * 0.8) // batch)
    epochs = max(3, int(seconds / max(per_epoch, 1e-3)))
    runs: dict[str, list[dict[str, Any]]] = {"none": [], "every": []}

    def one(kind: str, every_s: float) -> float:
        _, tele = _ours(b, csv, f"gpu-ckpt-{kind}", hidden, batch, epochs, checkpoint_every_s=every_s)
        steps = [s["step_s"] for s in tele["steps"]]
        runs[kind].append({"median": statistics.median(steps[5:]), "checkpoints": tele["checkpoints"]})
        return runs[kind][-1]["median"]

    base, ours = alternate(lambda: one("none", 0), lambda: one("every", 30), b.repeats)
    start = str(time.time() + 15)
    copy = result(sh(PY, str(PROBES / "state_copy.py"), ",".join(map(str, hidden)), start, "cuda", "5")[1])["s"]
    waits = []
    for r in runs["every"]:
        recent = r["checkpoints"]["recent"]
        mid = max(0, r["checkpoints"]["saved"] - 1)  # the last step's checkpoint is after the timed window
        waits += [w + s for w, s in zip(recent["wait_s"][:mid], recent["stall_s"][:mid], strict=True)]
    notes["checkpoint_every_30s"] = {
        "epochs": epochs,
        "median_step_ms": {
            "none": round(1000 * statistics.median(base), 3),
            "every 30 s": round(1000 * statistics.median(ours), 3),
        },
        "checkpoints_mid_run": [max(0, r["checkpoints"]["saved"] - 1) for r in runs["every"]],
        "state_mb": round(runs["every"][-1]["checkpoints"]["staged_bytes"] / 1e6, 1),
        "copy_to_pinned_s": round(copy, 4),
        "loop_wait_s": [round(w, 4) for w in waits],
        "write_s": runs["every"][-1]["checkpoints"]["recent"]["write_s"],
    }
    mfu_rows = [notes[n].pop("mfu_row") for n in SHAPES if "mfu_row" in notes.get(n, {})]
    return mfu_rows + [
        row(
            f"median step with a checkpoint every 30 s ({shape_name(hidden, batch)}, {epochs} epochs)",
            "the same run without checkpoints",
            "s",
            base,
            ours,
            "≤ 1.05×",
            False,
            lambda r, *_: r <= 1.05,
        ),
        row(
            "the loop's wait per checkpoint (staging into pinned buffers on a side stream)",
            "copying the state to pinned host memory by hand",
            "s",
            [copy] * max(1, len(waits)),
            waits or [float("nan")],
            "≤ 2×",
            False,
            lambda r, *_: r <= 2.0,
        ),
    ]
