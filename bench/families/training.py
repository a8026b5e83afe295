"""train_model's built-in function against a bare torch DDP loop: its throughput, its scaling (with
the bare loop's and the cores' own beside it), throughput by batch and data size. Checkpoints have
a family of their own (bench/families/checkpoint.py)."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from bench.common import PROBES, PY, Bench, alternate, bare_ddp, data_file, digits_snapshot, row, steady_sps, train


def run(b: Bench) -> list[dict[str, Any]]:
    work, repeats = b.work, b.repeats
    snap = digits_snapshot(work)
    # the overhead run: 16 copies of digits (about 360 steps per epoch), so an epoch is not a few ms
    big = digits_snapshot(work, 16)
    csv = data_file(big)
    epochs, batch = 3, 64
    losses: dict[str, float] = {}
    rows = []

    def bare_ddp_cpu(nproc: int, epochs: int, batch: int, hidden: str) -> dict[str, Any]:
        return bare_ddp(csv, nproc, epochs, batch, hidden, {"OMP_NUM_THREADS": "1"})

    def base() -> float:
        r = bare_ddp_cpu(2, epochs, batch, "64")
        losses["bare"] = r["final_loss"]
        return r["samples_per_second"]

    def ours() -> float:
        _, r, tele, _ = train(work, big, "train", 2, batch, epochs)
        losses["trainpipe"] = r["final_loss"]
        b.extra.setdefault("peak_rss_mb", {})["train_model (per rank, rank 0)"] = round(tele["peak_rss_mb"], 1)
        b.note(
            "time_to_first_step_s",
            {
                "from launch (process start, data, rendezvous, model)": round(tele["launch_to_first_step_s"], 2),
                "from the context's start (rendezvous with the other rank, data, model, checkpoint imports)": round(
                    tele["time_to_first_step_s"], 3
                ),
            },
        )
        return steady_sps(tele)

    bs, os_ = alternate(base, ours, repeats)
    diff = abs(losses["bare"] - losses["trainpipe"])
    rows.append(
        row(
            "train_model overhead (builtin:mlp on torch DDP, 2 ranks × 1 thread, gloo, 16× digits, batch 64, 3 epochs)",
            "bare torch DDP loop",
            "samples/s",
            bs,
            os_,
            "≥ 0.97",
            True,
            lambda r, *_: r >= 0.97,
            note=f"final loss bare {losses['bare']:.6f}, trainpipe {losses['trainpipe']:.6f} (|Δ| {diff:.1e})",
        )
    )

    # weak scaling: the same work per rank (512 rows, an MLP 64-512-512-10)
    wide = {"train_config": {"hidden_units": [512, 512], "learning_rate": 0.05}}
    one, two = [], []
    for _ in range(repeats):
        one.append(steady_sps(train(work, big, "w1", 1, 512, 3, **wide)[2]))
        two.append(steady_sps(train(work, big, "w2", 2, 1024, 3, **wide)[2]))
    rows.append(
        row(
            "DDP weak scaling on CPU (2 ranks × 1 thread vs 1 × 1; 512 rows/rank, MLP 64-512-512-10)",
            "1 rank × 1 thread",
            "samples/s",
            one,
            two,
            "≥ 1.7×",
            True,
            lambda r, *_: r >= 1.7,
        )
    )
    b1, b2 = alternate(
        lambda: bare_ddp_cpu(1, 3, 512, "512,512")["samples_per_second"],
        lambda: bare_ddp_cpu(2, 3, 1024, "512,512")["samples_per_second"],
        repeats,
    )
    rows.append(
        row(
            "bare torch DDP weak scaling, the same shape (what this machine allows)",
            "1 rank × 1 thread",
            "samples/s",
            b1,
            b2,
            "report",
            True,
        )
    )

    def cores(k: int) -> float:
        start = str(time.time() + 8)  # after every process has imported torch
        procs = [
            subprocess.Popen([PY, str(PROBES / "matmul.py"), start], stdout=subprocess.PIPE, text=True)
            for _ in range(k)
        ]
        return sum(300 / json.loads(p.communicate()[0])["s"] for p in procs)

    c1, c2 = alternate(lambda: cores(1), lambda: cores(2), repeats)
    rows.append(
        row(
            "matmul in two processes at once vs one (the cores' own scaling)",
            "1 process",
            "matmuls/s",
            c1,
            c2,
            "report",
            True,
        )
    )

    b.note(
        "throughput_by_batch_size_samples_per_s",
        {f"batch {bs_}": round(steady_sps(train(work, snap, f"b{bs_}", 1, bs_, 3)[2]), 1) for bs_ in (16, 64, 256)},
    )
    growth = {}
    for copies in (1, 4, 16):
        wall, r, tele, _ = train(work, digits_snapshot(work, copies), f"d{copies}", 1, 64, 1)
        loop = sum(s["step_s"] for s in tele["steps"])
        growth[f"{copies}× rows ({r['global_steps']} steps)"] = {
            "loop_s": round(loop, 3),
            "us_per_sample": round(1e6 * loop / (r["global_steps"] * 64), 2),
            "process_wall_s": round(wall, 2),
        }
    b.note("training_cost_by_data_size", growth)
    return rows
