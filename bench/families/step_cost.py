"""The context's cost per step, on this machine's CPU: teampkg.tiny (a linear layer, SGD: a step that is
nearly free) run by trainpipe's context against the same training as a bare loop, in one process
(bench/probes/step_cost.py): the worker's own context, DDP's one-process path, the loop and its step
records, alternately with the bare loop on the same rows and batches, each timed by the thread's CPU time
at two lengths so what a run does once cancels. Separate processes, or wall-clock steps, differ here by
more than the cost measured (±50-100 µs a step between rounds of the same loop). Target: at most 30 µs a
step; a small model on a big GPU pays it on every step (the GPU family's narrow row measures it there)."""

from __future__ import annotations

import json
from typing import Any

from bench.common import PROBES, PY, TEAM_PATH, Bench, digits, row, sh

EPOCHS, BATCH, ROUNDS = 15, 32, 6
TARGET_US = 30.0


def run(b: Bench) -> list[dict[str, Any]]:
    csv = b.work / "digits.csv"
    if not csv.exists():
        digits(csv)
    rounds = max(ROUNDS, b.repeats)
    _, out = sh(
        PY,
        str(PROBES / "step_cost.py"),
        str(csv),
        str(b.work / "step-cost"),
        str(EPOCHS),
        str(BATCH),
        str(rounds),
        env={**TEAM_PATH, "OMP_NUM_THREADS": "1"},
    )
    got = json.loads(out.strip().splitlines()[-1])
    base, mine = got["bare"][1:], got["trainpipe"][1:]  # the first round warms up the kernels
    added = sorted((o - x) * 1e6 for x, o in zip(base, mine, strict=True))
    median_us = added[len(added) // 2] if len(added) % 2 else (added[len(added) // 2 - 1] + added[len(added) // 2]) / 2
    b.note("step_cost", {"added_us_per_step": added, "steps_in_the_slope": got["steps"]})
    return [
        row(
            f"the context's cost per step (teampkg.tiny: linear 64-10, SGD, 1 rank × 1 thread, batch {BATCH}, digits; "
            f"CPU time per step, {EPOCHS} against {3 * EPOCHS} epochs, {len(base)} rounds in one process)",
            "the same training as a bare loop",
            "CPU s/step",
            base,
            mine,
            f"≤ +{TARGET_US:.0f} µs a step",
            higher_is_better=False,
            met=lambda *_: median_us <= TARGET_US,
            note=f"+{median_us:.1f} µs a step (rounds: {', '.join(f'{a:+.1f}' for a in added)})",
        )
    ]
