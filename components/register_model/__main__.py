"""Container entrypoint: ``python -m trainpipe.components.register_model``."""

from trainpipe.components.register_model.core import register_model
from trainpipe.components.register_model.dry import dry_run
from trainpipe.components.register_model.spec import NAME, RegisterModelConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(
        NAME,
        RegisterModelConfig,
        register_model,
        dry=dry_run,
        doc="Register a gated model in the MLflow registry with its lineage.",
    )
