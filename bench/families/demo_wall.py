"""The demo's pipeline end to end, as a newcomer runs it (``trainpipe demo``'s config: digits, 2 gloo ranks, 8 epochs,
a first run with no champion yet), on kfp-local and on airflow-local, against ``python -c "import torch"`` measured
alternately in the same run (issue 57 §3): targets ≤ 8× the import on kfp-local, ≤ 10× on airflow-local. Beside each
row, each step's own seconds (the ``ok in`` of its line) and the engine's rest: the wall less the steps' sum, what
the engine spends around them (its start, the pipeline's build or the DAG's parse and database, each task's
process)."""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import PY, Bench, BenchError, alternate, row, sh

TARGETS = {"kfp-local": 8.0, "airflow-local": 10.0}

_STEP = re.compile(r"trainpipe (\w+): ok in ([\d.]+)s")


def demo_run(b: Bench, engine: str, i: int, seen: list[dict[str, float]]) -> float:
    """One ``trainpipe run`` of the demo's config in a fresh workspace: its wall (its steps' seconds go to ``seen``).

    Raises:
        BenchError: the run failed.
    """
    from trainpipe.demo import write_demo_config

    folder = b.work / f"demo-{engine}-{i}"
    shutil.rmtree(folder, ignore_errors=True)
    config = write_demo_config(folder)
    t = time.perf_counter()
    proc = subprocess.run(
        [str(Path(PY).parent / "trainpipe"), "run", "--config", str(config), "--engine", engine],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise BenchError(f"trainpipe run --engine {engine} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    steps = {m[1]: float(m[2]) for m in _STEP.finditer(proc.stdout + proc.stderr)}
    seen.append({**steps, "_wall": wall})
    shutil.rmtree(folder, ignore_errors=True)
    return wall


def run(b: Bench) -> list[dict[str, Any]]:
    rows, figures = [], {}
    for engine, target in TARGETS.items():
        seen: list[dict[str, float]] = []
        base, ours = alternate(
            lambda: sh(PY, "-c", "import torch")[0],
            lambda engine=engine, seen=seen: demo_run(b, engine, len(seen), seen),
            b.repeats,
        )
        names = [k for k in seen[0] if not k.startswith("_")]
        steps = {k: round(statistics.median(s.get(k, 0.0) for s in seen), 2) for k in names}
        rest = statistics.median(s["_wall"] - sum(v for k, v in s.items() if not k.startswith("_")) for s in seen)
        figures[engine] = {
            "wall_s": round(statistics.median(ours), 2),
            "import_torch_s": round(statistics.median(base), 3),
            "steps_s": steps,
            "engine_rest_s": round(rest, 2),
        }
        print(f"  {engine}: {figures[engine]}", flush=True)
        rows.append(
            row(
                f"the demo's pipeline end to end on {engine} (digits, 2 gloo ranks, 8 epochs, no champion yet)",
                'python -c "import torch"',
                "s",
                base,
                ours,
                f"≤ {target:g}× the import",
                False,
                lambda r, *_, target=target: r <= target,
                note=f"steps {sum(steps.values()):.1f} s ("
                + ", ".join(f"{k} {v:.1f}" for k, v in steps.items())
                + f"); the engine's rest {rest:.1f} s",
            )
        )
    b.note("demo_wall", figures)
    return rows
