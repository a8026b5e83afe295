"""How soon trainpipe answers a newcomer, against ``python -c "import torch"`` measured alternately in the same
run (issue 57): ``trainpipe validate_data`` on 20 rows of digits (the default suite: training's preconditions,
checked without GX's import, Data Docs included), target ≤ 1.5× the import; and ``trainpipe run --dry-run`` of
the demo's pipeline on kfp-local (every step checks its settings and says what it received), target ≤ 3×."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bench.common import PY, Bench, alternate, digits, row, sh

VALIDATE_TARGET = 1.5
DRY_RUN_TARGET = 3.0


def run(b: Bench) -> list[dict[str, Any]]:
    import pandas as pd

    from trainpipe.demo import write_demo_config

    cli = str(Path(PY).parent / "trainpipe")
    raw = b.work / "digits.csv"
    if not raw.exists():
        digits(raw)
    small = b.work / "digits-20.csv"
    pd.read_csv(raw).head(20).to_csv(small, index=False)

    def torch() -> float:
        return sh(PY, "-c", "import torch")[0]

    def validate() -> float:
        shutil.rmtree(b.work / "fa-v", ignore_errors=True)
        args = ("--data", str(small), "--output-dir", str(b.work / "fa-v"), "--batch-size", "4")
        return sh(cli, "validate_data", *args)[0]

    config = write_demo_config(b.work / "fa-demo")

    def dry_run() -> float:
        return sh(cli, "run", "--config", str(config), "--engine", "kfp-local", "--dry-run")[0]

    return [
        row(
            "trainpipe validate_data on 20 rows of digits (default suite, Data Docs; batch_size 4)",
            'python -c "import torch"',
            "s",
            *alternate(torch, validate, b.repeats),
            f"≤ {VALIDATE_TARGET:g}× the import",
            False,
            lambda r, *_: r <= VALIDATE_TARGET,
        ),
        row(
            "trainpipe run --dry-run, the demo's pipeline on kfp-local",
            'python -c "import torch"',
            "s",
            *alternate(torch, dry_run, b.repeats),
            f"≤ {DRY_RUN_TARGET:g}× the import",
            False,
            lambda r, *_: r <= DRY_RUN_TARGET,
        ),
    ]
