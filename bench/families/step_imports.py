"""Each step's start-up: the seconds its process spends importing (``python -X importtime``, every import of the
run, the libraries its work needs included), for each of the demo's seven steps on digits, against
``python -c "import torch"`` measured alternately in the same run; beside it, the rest of the process (its own work).
detect_drift runs as on the demo's first run:
a model with no champion yet (nothing to compare with). What each step imported most is noted beside it."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import time
from typing import Any

from bench.common import PY, Bench, BenchError, alternate, row, sh
from bench.families import startup

#: The demo's steps, in the pipeline's order.
STEPS = (
    "validate_data",
    "snapshot_dataset",
    "detect_drift",
    "train_model",
    "evaluate_model",
    "profile_training",
    "register_model",
)

_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \|( +)(\S+)")


def import_seconds(stderr: str) -> tuple[float, dict[str, float]]:
    """All the process's import time from ``-X importtime``'s lines (each outermost import's cumulative time),
    and by top-level package."""
    by: dict[str, float] = {}
    for m in _LINE.finditer(stderr):
        if len(m[2]) == 1:  # an outermost import: its children are in its cumulative time
            top = m[3].split(".")[0]
            by[top] = by.get(top, 0.0) + int(m[1]) / 1e6
    return sum(by.values()), by


def step(b: Bench, name: str, args: list[str], i: int, seen: list[tuple[float, float, dict[str, float]]]) -> float:
    """One run of the step with ``-X importtime``: its import seconds (its wall and packages go to ``seen``)."""
    argv = [a.replace("{i}", f"imp{i}") for a in args]
    for a in argv:
        if a.startswith(str(b.work / "su-")):
            shutil.rmtree(a, ignore_errors=True)
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    t = time.perf_counter()
    proc = subprocess.run(
        [PY, "-m", f"trainpipe.components.{name}", *argv], capture_output=True, text=True, env=env, check=False
    )
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise BenchError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    seconds, by = import_seconds(proc.stderr)
    seen.append((seconds, wall, by))
    return seconds


def run(b: Bench) -> list[dict[str, Any]]:
    inputs = startup._inputs(b)
    startup._prepare(b, inputs)
    track = f"sqlite:///{b.work / 'step-imports-mlflow.db'}"
    inputs["detect_drift"] = [
        *("--data", inputs["detect_drift"][1], "--model-name", "step-imports-none", "--tracking-uri", track),
        *("--output-dir", str(b.work / "su-d{i}")),
    ]
    rows, figures = [], {}
    for name in STEPS:
        seen: list[tuple[float, float, dict[str, float]]] = []
        base, ours = alternate(
            lambda: sh(PY, "-c", "import torch")[0],
            lambda name=name, seen=seen: step(b, name, inputs[name], len(seen), seen),
            b.repeats,
        )
        by = {k: statistics.median(s[2].get(k, 0.0) for s in seen) for k in {k for s in seen for k in s[2]}}
        top = sorted(by.items(), key=lambda kv: -kv[1])[:4]
        figures[name] = {
            "import_s": round(statistics.median(ours), 3),
            "wall_s": round(statistics.median(s[1] for s in seen), 3),
            "import_torch_s": round(statistics.median(base), 3),
            # what the process spent besides importing: its own work (and the interpreter's start and exit)
            "rest_s": round(statistics.median(s[1] - s[0] for s in seen), 3),
            "top": {k: round(v, 3) for k, v in top},
        }
        print(f"  {name}: {figures[name]}", flush=True)
        rows.append(
            row(
                f"{name}'s start-up on the demo: its imports (-X importtime; digits"
                f"{', no champion yet' if name == 'detect_drift' else ''})",
                'python -c "import torch"',
                "s",
                base,
                ours,
                "report",
                False,
                note="most: "
                + ", ".join(f"{k} {v:.2f} s" for k, v in top)
                + f"; whole process {figures[name]['wall_s']:.2f} s, of which its own work and the interpreter "
                f"{figures[name]['rest_s']:.2f} s",
            )
        )
    b.note("step_imports", figures)
    return rows
