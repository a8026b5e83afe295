"""detect_drift's dry run (:mod:`trainpipe.contract.dry`): its settings are checked, nothing is compared."""

from __future__ import annotations

from typing import Any

from trainpipe.components.detect_drift.spec import DetectDriftConfig, DetectDriftResult
from trainpipe.contract import dry
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime


def dry_run(config: DetectDriftConfig, lineage: Lineage, runtime: Runtime) -> tuple[dict[str, Any], DetectDriftResult]:
    """Says to retrain, so a dry pipeline goes on to the steps after it."""
    dry.report(config.output_dir)
    return {}, dry.stub(DetectDriftResult, lineage=lineage, retrain=True, reasons=["dry run: nothing compared"])
