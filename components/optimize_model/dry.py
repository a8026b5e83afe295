"""optimize_model's dry run (:mod:`trainpipe.contract.dry`): its settings are checked, nothing is exported."""

from __future__ import annotations

from typing import Any

from trainpipe.components.optimize_model.spec import OptimizeModelConfig, OptimizeModelResult
from trainpipe.contract import dry
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime


def dry_run(
    config: OptimizeModelConfig, lineage: Lineage, runtime: Runtime
) -> tuple[dict[str, Any], OptimizeModelResult]:
    """No variant: which ones it would make is in its settings."""
    dry.report(config.output_dir)
    return {}, dry.stub(OptimizeModelResult, lineage=lineage, selected=None, reason="dry run: nothing measured")
