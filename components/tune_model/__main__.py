"""Container entrypoint: ``python -m trainpipe.components.tune_model``."""

from trainpipe.components.tune_model.core import tune_model
from trainpipe.components.tune_model.dry import dry_run
from trainpipe.components.tune_model.spec import NAME, TuneModelConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(
        NAME,
        TuneModelConfig,
        tune_model,
        dry=dry_run,
        doc="Search train_model's settings with Optuna: trials are real trainings, scored on validation rows.",
    )
