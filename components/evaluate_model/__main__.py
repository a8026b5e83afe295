"""Container entrypoint: ``python -m trainpipe.components.evaluate_model``."""

import os

# This process is a component's entrypoint, not a library user's: skip pydantic's plugin discovery
# (a scan of every installed distribution's entry points, ~50-80 ms per step start) unless asked for.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from trainpipe.components.evaluate_model.core import evaluate_model
from trainpipe.components.evaluate_model.spec import NAME, EvaluateModelConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(NAME, EvaluateModelConfig, evaluate_model, doc="Score a model on its held-out split and decide the gate.")
