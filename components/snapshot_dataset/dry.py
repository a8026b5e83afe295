"""snapshot_dataset's dry run (:mod:`trainpipe.contract.dry`): its settings are checked, nothing is versioned."""

from __future__ import annotations

from typing import Any

from trainpipe.components.snapshot_dataset.spec import SnapshotDatasetConfig, SnapshotDatasetResult
from trainpipe.contract import dry
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime


def dry_run(
    config: SnapshotDatasetConfig, lineage: Lineage, runtime: Runtime
) -> tuple[dict[str, Any], SnapshotDatasetResult]:
    """A snapshot of nothing: the next steps' dataset hash is ``dry``."""
    return {}, dry.stub(SnapshotDatasetResult, lineage=lineage, md5="dry", rev="dry")
