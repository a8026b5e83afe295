"""Container entrypoint: ``python -m trainpipe.components.register_model``."""

import os

# This process is a component's entrypoint, not a library user's: skip pydantic's plugin discovery
# (a scan of every installed distribution's entry points, ~50-80 ms per step start) unless asked for.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from trainpipe.components.register_model.core import register_model
from trainpipe.components.register_model.spec import NAME, RegisterModelConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(NAME, RegisterModelConfig, register_model, doc="Register a gated model in the MLflow registry with its lineage.")
