"""tune_model's dry run (:mod:`trainpipe.contract.dry`): what its trials would train, no trial run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainpipe.components.tune_model.core import trusting_its_function
from trainpipe.components.tune_model.spec import BEST_FILE, TuneModelConfig, TuneModelResult
from trainpipe.components.tune_model.trial import sample, trial_settings
from trainpipe.contract import dry
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_settings
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime
from trainpipe.services.profiles import prices_of


def dry_run(config: TuneModelConfig, lineage: Lineage, runtime: Runtime) -> tuple[dict[str, Any], TuneModelResult]:
    """The function the study searches, the settings its baseline trial and one sampled trial would train
    with (each a train_model configuration), and the prices a cost objective is figured at. Its ``tuned``
    output holds the baseline's settings, so a dry train_model takes them as a real one takes the best."""
    import optuna

    runtime = trusting_its_function(runtime, config)
    prices = prices_of(runtime.hardware_profile)
    if (config.max_cost is not None or any(o.metric == "cost" for o in config.objectives)) and prices is None:
        field = "max_cost" if config.max_cost is not None else "objectives"
        raise InputError(
            f"{field}: the hardware profile {runtime.hardware_profile!r} declares no prices, so no trial has a cost "
            "(give the profile prices:, or use gpu_seconds / max_gpu_hours)"
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=config.seed)).ask()
    baseline = trial_settings(config, {})
    received = {
        "train_function": str(config.train.get("train_function", "builtin:mlp")),
        "trusted_code": list(runtime.trusted_code),
        "baseline": baseline,
        "trial": trial_settings(config, sample(trial, config.space)),
        "prices": prices.model_dump(mode="json") if prices is not None else None,
    }
    if config.summarize:
        atomic_write_settings(Path(config.output_dir) / BEST_FILE, baseline)  # in the order it was written
    result = dry.stub(
        TuneModelResult,
        lineage=lineage,
        study_name=config.study_name or "dry",
        objectives=[o.metric for o in config.objectives],
        best_settings=baseline,
        report_file=dry.report(config.output_dir),
    )
    return received, result
