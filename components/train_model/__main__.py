"""Container entrypoint: ``python -m trainpipe.components.train_model``."""

import os

# This process is a component's entrypoint, not a library user's: skip pydantic's plugin discovery
# (a scan of every installed distribution's entry points, ~50-80 ms per step start) unless asked for.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from trainpipe.components.train_model.core import train_model
from trainpipe.components.train_model.spec import NAME, TrainModelConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(NAME, TrainModelConfig, train_model, doc="Train a model (torch DDP, TensorFlow multi-worker or Horovod) and log it to MLflow.")
