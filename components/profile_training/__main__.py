"""Container entrypoint: ``python -m trainpipe.components.profile_training``."""

import os

# This process is a component's entrypoint, not a library user's: skip pydantic's plugin discovery
# (a scan of every installed distribution's entry points, ~50-80 ms per step start) unless asked for.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from trainpipe.components.profile_training.core import profile_training
from trainpipe.components.profile_training.spec import NAME, ProfileTrainingConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(NAME, ProfileTrainingConfig, profile_training, doc="Report throughput, step-time breakdown and memory of a training run.")
