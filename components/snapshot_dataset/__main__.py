"""Container entrypoint: ``python -m trainpipe.components.snapshot_dataset``."""

from trainpipe.components.snapshot_dataset.core import snapshot_dataset
from trainpipe.components.snapshot_dataset.dry import dry_run
from trainpipe.components.snapshot_dataset.spec import NAME, SnapshotDatasetConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(
        NAME,
        SnapshotDatasetConfig,
        snapshot_dataset,
        dry=dry_run,
        doc="Snapshot a validated dataset with DVC and push it to a remote.",
    )
