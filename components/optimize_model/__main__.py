"""Container entrypoint: ``python -m trainpipe.components.optimize_model``."""

from trainpipe.components.optimize_model.core import optimize_model
from trainpipe.components.optimize_model.dry import dry_run
from trainpipe.components.optimize_model.spec import NAME, OptimizeModelConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(
        NAME,
        OptimizeModelConfig,
        optimize_model,
        dry=dry_run,
        doc="Export a trained model to ONNX, quantize and prune it for CPU, and hand on the fastest variant within the "
        "metric drop.",
    )
