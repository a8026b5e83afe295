"""train_model with the slurm launcher against the same training with the local launcher, on a real
one-node Slurm cluster started for the run (tests/helpers/slurm_cluster.py: munged, slurmctld,
slurmd on loopback ports): end to end, and from the step's start to the first training step. The
difference is what Slurm adds: sbatch, the scheduler's pass (once a second here), the job's prolog,
srun, and the polling (every 0.5 s here). Both sides log to one SQLite MLflow store; digits, 2 gloo
ranks, 3 epochs."""

from __future__ import annotations

import json
import time
from typing import Any

from bench.common import PY, Bench, BenchError, alternate, digits_snapshot, row, sh


def run(b: Bench) -> list[dict[str, Any]]:
    from tests.helpers.slurm_cluster import missing, slurm_cluster

    if gone := missing():
        raise BenchError(f"Slurm is not installed (make slurm): missing {', '.join(gone)}")
    snap = digits_snapshot(b.work)
    track = f"sqlite:///{b.work / 'slurm-mlflow.db'}"
    n = [0]
    first: dict[str, list[float]] = {"local": [], "slurm": []}

    def train(side: str, extra: list[str], env: dict[str, str]) -> float:
        n[0] += 1
        out = b.work / f"slurm-bench-{n[0]}"
        start = time.time()
        wall, _ = sh(
            PY,
            "-m",
            "trainpipe.components.train_model",
            "--data",
            str(snap),
            "--output-dir",
            str(out),
            "--tracking-uri",
            track,
            "--nproc-per-node",
            "2",
            "--epochs",
            "3",
            "--checkpoint-every-steps",
            "0",
            *extra,
            env=env,
        )
        tele = json.loads((out / "telemetry" / "rank0.json").read_text())
        first[side].append(tele["first_step_unix"] - start)
        return wall

    with slurm_cluster(b.work / "slurm-cluster") as env:
        slurm = ["--slurm", json.dumps({"profile": "cpu", "poll_s": 0.5})]
        train("local", [], env)  # creates the MLflow store; not counted
        first["local"].clear()
        base, ours = alternate(lambda: train("local", [], env), lambda: train("slurm", slurm, env), max(3, b.repeats))
    b.note("slurm_submit_to_first_step_s", {k: [round(v, 2) for v in vs] for k, vs in first.items()})
    return [
        row(
            "train_model end to end, slurm launcher (1 node, 2 ranks, digits)",
            "the same training with the local launcher",
            "s",
            base,
            ours,
            "report seconds",
            False,
            note=f"+{_median(ours) - _median(base):.1f} s for Slurm",
        ),
        row(
            "start of the step to the first training step, slurm launcher",
            "the same with the local launcher",
            "s",
            first["local"],
            first["slurm"],
            "report seconds",
            False,
            note=f"+{_median(first['slurm']) - _median(first['local']):.1f} s for Slurm",
        ),
    ]


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)
