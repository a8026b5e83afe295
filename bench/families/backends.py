"""Horovod and TensorFlow under train_model against the bare framework loops (2 workers × 1 thread).

A run's steady window is 2-3 s of 2 ms steps, and two such runs on a 2-core machine differ by up to
±20% whoever runs them, so these take at least 6 pairs; the median step time of each run (robust to
a few descheduled steps) is reported beside the throughput."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench.common import (
    BASELINES,
    PY,
    Bench,
    BenchError,
    alternate,
    data_file,
    digits_snapshot,
    result,
    row,
    sh,
    steady_sps,
    train,
)
from trainpipe.training.launch import free_ports

ONE_THREAD = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}


def run(b: Bench) -> list[dict[str, Any]]:
    repeats = max(b.repeats, 6)
    big = digits_snapshot(b.work, 16)
    args = [str(data_file(big)), "label", "2", "64", "0.05", "0", "64"]
    step_s: dict[str, list[float]] = {}

    def bare_horovod() -> float:
        _, out = sh(
            str(Path(PY).parent / "horovodrun"),
            "--gloo",
            "-np",
            "2",
            "-H",
            "localhost:2",
            PY,
            str(BASELINES / "bare_horovod.py"),
            *args,
            env=ONE_THREAD,
        )
        line = next(line for line in out.splitlines() if "samples_per_second" in line)  # horovodrun prefixes rank tags
        r = json.loads(line[line.index("{") :])
        step_s.setdefault("bare", []).append(r["median_step_s"])
        return r["samples_per_second"]

    def bare_tf() -> float:
        cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
        procs = [
            subprocess.Popen(
                [PY, str(BASELINES / "bare_tf.py"), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env={
                    **os.environ,
                    **ONE_THREAD,
                    "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
                },
            )
            for i in range(2)
        ]
        outs = [p.communicate(timeout=900)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise BenchError("the bare TensorFlow workers failed")
        r = result(outs[0])
        step_s.setdefault("bare", []).append(r["median_step_s"])
        return r["samples_per_second"]

    def ours(backend: str) -> float:
        tele = train(b.work, big, f"be-{backend}", 2, 64, 2, backend=backend)[2]
        step_s.setdefault("ours", []).append(statistics.median(s["step_s"] for s in tele["steps"]))
        return steady_sps(tele)

    rows = []
    for backend, bare in (("horovod", bare_horovod), ("tensorflow", bare_tf)):
        step_s.clear()
        base, mine = alternate(bare, lambda backend=backend: ours(backend), repeats)
        speed = statistics.median(
            x / y for x, y in zip(step_s["bare"], step_s["ours"], strict=True)
        )  # per step, higher is better
        rows.append(
            row(
                f"{backend} under train_model (2 workers × 1 thread, 16× digits, batch 64)",
                f"bare {backend} loop",
                "samples/s",
                base,
                mine,
                "≥ 0.95",
                True,
                lambda r, *_: r >= 0.95,
                note=f"median step time: bare {statistics.median(step_s['bare']) * 1e3:.2f} ms, trainpipe "
                f"{statistics.median(step_s['ours']) * 1e3:.2f} ms (per-pair speed ratio {speed:.3f})",
            )
        )
    return rows
