"""The benchmark families, in the order `make bench` runs them: each is a function from the run's
:class:`~bench.common.Bench` to its rows of the results table (what else it measured it notes on
the Bench). Each makes the data it needs unless an earlier one left it in the work folder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.common import Bench
from bench.families import (
    backends,
    checkpoint,
    data,
    demo_wall,
    drift,
    end_phase,
    features,
    first_answers,
    footprint,
    gpu,
    optimize,
    orchestration,
    parse,
    signing,
    slurm,
    startup,
    step_cost,
    step_imports,
    team,
    telemetry,
    training,
    tune,
)

FAMILIES: dict[str, Callable[[Bench], list[dict[str, Any]]]] = {
    "training": training.run,
    "step_cost": step_cost.run,
    "startup": startup.run,
    "step_imports": step_imports.run,
    "first_answers": first_answers.run,
    "demo_wall": demo_wall.run,
    "checkpoint": checkpoint.run,
    "end_phase": end_phase.run,
    "team": team.run,
    "telemetry": telemetry.run,
    "other_backends": backends.run,
    "orchestration": orchestration.run,
    "slurm": slurm.run,
    "tune": tune.run,
    "validate": data.validate,
    "snapshot": data.snapshot,
    "feature_set": features.run,
    "drift": drift.run,
    "optimize": optimize.run,
    "signing": signing.run,
    "dag_parse": parse.dag_parse,
    "compile": parse.compile_,
    "rss": footprint.run,
    "gpu": gpu.run,
}
