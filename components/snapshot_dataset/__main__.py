"""Container entrypoint: ``python -m trainpipe.components.snapshot_dataset``."""

import os

# This process is a component's entrypoint, not a library user's: skip pydantic's plugin discovery
# (a scan of every installed distribution's entry points, ~50-80 ms per step start) unless asked for.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from trainpipe.components.snapshot_dataset.core import snapshot_dataset
from trainpipe.components.snapshot_dataset.spec import NAME, SnapshotDatasetConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(NAME, SnapshotDatasetConfig, snapshot_dataset, doc="Snapshot a validated dataset with DVC and push it to a remote.")
