"""The context's own cost per step, on this machine's CPU: train_model running teampkg.tiny (a step that
is nearly free) on one rank against the same training as a bare loop (bench/baselines/bare_tiny.py: the
same rows, order and ops). Both medians are whole iterations, step end to step end, the batch's gathering
included; their difference is what the context adds to every step: the timing marks, the step record,
the loop's bookkeeping and the work between batches. Target: at most 30 µs a step (a small model on a big
GPU pays it on every step; the GPU family's narrow row measures the same there)."""

from __future__ import annotations

from typing import Any

from bench.common import BASELINES, PY, TEAM_PATH, Bench, alternate, digits, result, row, sh, train

EPOCHS, BATCH = 20, 32
TARGET_US = 30.0


def run(b: Bench) -> list[dict[str, Any]]:
    csv = b.work / "digits.csv"
    if not csv.exists():
        digits(csv)
    args = (str(csv), "label", str(EPOCHS), str(BATCH), "0")

    def bare() -> float:
        _, out = sh(PY, str(BASELINES / "bare_tiny.py"), *args, env={**TEAM_PATH, "OMP_NUM_THREADS": "1"})
        return float(result(out)["median_step_s"])

    def ours() -> float:
        _, _, tele, _ = train(
            b.work,
            csv,
            "step-cost",
            1,
            BATCH,
            EPOCHS,
            env=TEAM_PATH,
            train_function="teampkg.tiny:train",
            train_config={},
            checkpoint_every_s=0,
            metrics_port=0,
        )
        steps = sorted(s["step_s"] for s in tele["steps"][5:])
        return steps[len(steps) // 2]

    base, mine = alternate(bare, ours, max(b.repeats, 3))
    added = sorted((o - x) * 1e6 for x, o in zip(base, mine, strict=True))
    median_us = added[len(added) // 2]
    b.note("step_cost", {"added_us_per_step": added})
    return [
        row(
            "the context's cost per step (teampkg.tiny: linear 64-10, SGD, 1 rank × 1 thread, batch 32, digits, "
            f"{EPOCHS} epochs; median step, batch gathering included)",
            "the same training as a bare loop",
            "s",
            base,
            mine,
            f"≤ +{TARGET_US:.0f} µs a step",
            higher_is_better=False,
            met=lambda _ratio, mb, mo: (mo - mb) * 1e6 <= TARGET_US,
            note=f"+{median_us:.1f} µs a step (pairs: {', '.join(f'{a:+.1f}' for a in added)})",
        )
    ]
