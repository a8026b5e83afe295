"""A step's fixed cost: from its process's start to the first line of its work (the core called, after the
interpreter, the imports, reading and checking the settings and the inputs), each component's entrypoint on
digits (bench/probes/first_work.py marks the moment), against ``python -c "import torch"`` measured
alternately in the same run: what a step would pay for one import of the framework it trains with. Each
step's whole process on the same tiny input, and ``--help``, are noted beside it."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import PROBES, PY, Bench, BenchError, alternate, digits, digits_snapshot, row, sh

#: A step that does not train pays less to start than the framework's import alone.
TARGET_RATIO = 1.0


def _inputs(b: Bench) -> dict[str, list[str]]:
    """Each component's arguments on digits, ``{i}`` standing for the run's number (a fresh output each run)."""
    w, track = b.work, f"sqlite:///{b.work / 'startup-mlflow.db'}"
    snap = str(digits_snapshot(w))
    model = str(w / "startup-m")
    space = {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.1, "log": True}}
    return {
        "validate_data": ["--data", str(w / "digits.csv"), "--output-dir", str(w / "su-v{i}")],
        "snapshot_dataset": [
            *("--data", str(w / "digits-validated"), "--output-dir", str(w / "su-s{i}")),
            *("--repo-dir", str(w / "su-repo{i}"), "--remote-url", str(w / "su-remote{i}")),
        ],
        "train_model": [
            *("--data", snap, "--output-dir", str(w / "su-m{i}"), "--tracking-uri", track),
            *("--epochs", "1", "--nproc-per-node", "1", "--checkpoint-every-steps", "0"),
        ],
        "profile_training": ["--model", model, "--output-dir", str(w / "su-p{i}"), "--tracking-uri", track],
        "evaluate_model": [
            *("--model", model, "--data", snap, "--output-dir", str(w / "su-e{i}")),
            *("--tracking-uri", track, "--model-name", "startup"),
        ],
        "register_model": [
            *("--model", model, "--decision", str(w / "startup-e"), "--training-profile", str(w / "startup-p")),
            *("--output-dir", str(w / "su-r{i}"), "--tracking-uri", track, "--model-name", "startup"),
        ],
        "detect_drift": [
            *("--data", snap, "--model-name", "startup", "--tracking-uri", track),
            *("--output-dir", str(w / "su-d{i}")),
        ],
        "optimize_model": [
            *("--model", model, "--data", snap, "--output-dir", str(w / "su-o{i}")),
            *("--variants", '["int8_dynamic"]'),
        ],
        "tune_model": [
            *("--data", snap, "--output-dir", str(w / "su-t{i}"), "--tracking-uri", track),
            *("--space", json.dumps(space), "--n-trials", "2"),
            *("--train", json.dumps({"epochs": 1, "nproc_per_node": 1, "checkpoint_every_steps": 0})),
        ],
    }


def _prepare(b: Bench, inputs: dict[str, list[str]]) -> None:
    """What the later steps read: a model, its profile, its gate decision, a registered champion."""
    if not (b.work / "digits.csv").exists():
        digits(b.work / "digits.csv")
    for name, out in (
        ("train_model", "startup-m"),
        ("profile_training", "startup-p"),
        ("evaluate_model", "startup-e"),
        ("register_model", "startup-r"),
    ):
        if not (b.work / out).is_dir():
            args = [a.replace(f"su-{out[-1]}{{i}}", out) for a in inputs[name]]  # su-m{i} -> startup-m
            sh(PY, "-m", f"trainpipe.components.{name}", *args)


def step(b: Bench, name: str, args: list[str], i: int) -> tuple[float, float]:
    """One run of the step: seconds from its start to its core's start, and its whole process."""
    mark = b.work / f"first-work-{name}"
    mark.unlink(missing_ok=True)
    argv = [a.replace("{i}", str(i)) for a in args]
    for a in argv:
        if a.startswith(str(b.work / "su-")):
            shutil.rmtree(a, ignore_errors=True)
    env = {**os.environ, "BENCH_FIRST_WORK": str(mark)}
    started = time.time()
    t = time.perf_counter()
    proc = subprocess.run(
        [PY, str(PROBES / "first_work.py"), name, *argv], capture_output=True, text=True, env=env, check=False
    )
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise BenchError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return float(mark.read_text()) - started, wall


def run(b: Bench) -> list[dict[str, Any]]:
    inputs = _inputs(b)
    _prepare(b, inputs)
    cli = str(Path(PY).parent / "trainpipe")
    figures: dict[str, dict[str, Any]] = {}
    pairs: dict[str, tuple[list[float], list[float]]] = {}
    for name, args in inputs.items():
        runs: list[tuple[float, float]] = []

        def ours(name: str = name, args: list[str] = args, runs: list = runs) -> float:
            runs.append(step(b, name, args, len(runs)))
            return runs[-1][0]

        pairs[name] = alternate(lambda: sh(PY, "-c", "import torch")[0], ours, b.repeats)
        helps = [sh(cli, name, "--help")[0] for _ in range(b.repeats)]
        figures[name] = {
            "first_work_s": round(statistics.median(r[0] for r in runs), 3),
            "total_s": round(statistics.median(r[1] for r in runs), 3),
            "help_s": round(statistics.median(helps), 3),
            "import_torch_s": round(statistics.median(pairs[name][0]), 3),
        }
        print(f"  {name}: {figures[name]}", flush=True)
    b.note("step_fixed_cost", figures)
    slowest = max(figures, key=lambda n: figures[n]["first_work_s"])
    return [
        row(
            f"a step's fixed cost: its process's start to its first line of work (the slowest entrypoint, {slowest}; "
            "digits; every component's figures, whole process and --help in step_fixed_cost)",
            'python -c "import torch"',
            "s",
            *pairs[slowest],
            f"≤ {TARGET_RATIO:g}× the import",
            False,
            lambda r, mb, mo: r <= TARGET_RATIO,
            note=", ".join(f"{n} {f['first_work_s']:.2f} s" for n, f in figures.items()),
        )
    ]
