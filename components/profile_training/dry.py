"""profile_training's dry run (:mod:`trainpipe.contract.dry`): its settings are checked, nothing is profiled."""

from __future__ import annotations

from typing import Any

from trainpipe.components.profile_training.spec import ProfileTrainingConfig, ProfileTrainingResult
from trainpipe.contract import dry
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime
from trainpipe.services.profiles import prices_of


def dry_run(
    config: ProfileTrainingConfig, lineage: Lineage, runtime: Runtime
) -> tuple[dict[str, Any], ProfileTrainingResult]:
    """The prices the profile's cost per epoch would be figured at."""
    prices = prices_of(runtime.hardware_profile)
    received = {"prices": prices.model_dump(mode="json") if prices is not None else None}
    times = {"mean": 0.0, "p50": 0.0, "p95": 0.0}
    result = dry.stub(ProfileTrainingResult, lineage=lineage, step_time_ms=times, report=dry.report(config.output_dir))
    return received, result
