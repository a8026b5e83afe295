"""Container entrypoint: ``python -m trainpipe.components.evaluate_model``."""

from trainpipe.components.evaluate_model.core import evaluate_model
from trainpipe.components.evaluate_model.dry import dry_run
from trainpipe.components.evaluate_model.spec import NAME, EvaluateModelConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(
        NAME,
        EvaluateModelConfig,
        evaluate_model,
        dry=dry_run,
        doc="Score a model on its held-out split and decide the gate.",
    )
