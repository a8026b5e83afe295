"""train_model's dry run (:mod:`trainpipe.contract.dry`): what the training would be given, nothing trained."""

from __future__ import annotations

from typing import Any

from trainpipe.components.train_model.core import spending_of, with_tuned
from trainpipe.components.train_model.spec import TrainModelConfig, TrainModelResult
from trainpipe.contract import dry
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime
from trainpipe.services.profiles import profile_name
from trainpipe.training.preflight import check_settings


def dry_run(config: TrainModelConfig, lineage: Lineage, runtime: Runtime) -> tuple[dict[str, Any], TrainModelResult]:
    """The settings the ranks would get (tune's best laid over them), checked as a real run checks them before
    its ranks start (the backend, the devices, the function's package, a budget against the profile's prices);
    the data is not read and the function not imported."""
    config = with_tuned(config)
    check_settings(config)
    spending = spending_of(config, runtime.hardware_profile)
    job = "slurm" if config.slurm is not None else "cluster" if config.cluster is not None and config.nnodes > 1 else ""
    received = {
        "train_function": config.train_function,
        "train_config": config.train_config,
        "settings": config.model_dump(mode="json", exclude={"train_config"}),
        "prices": spending.prices.model_dump(mode="json") if spending.prices is not None else None,
        "budget": spending.budget is not None,
        "job": job or "local",
    }
    result = dry.stub(
        TrainModelResult,
        lineage=lineage,
        train_function=config.train_function,
        task=config.task,
        backend=config.backend,
        precision=config.precision,
        hardware_profile=profile_name(runtime.hardware_profile),
        model_sha256="dry",
    )
    return received, result
