"""evaluate_model's dry run (:mod:`trainpipe.contract.dry`): its settings are checked, nothing is scored."""

from __future__ import annotations

from typing import Any

from trainpipe.components.evaluate_model.spec import EvaluateModelConfig, EvaluateModelResult, GateDecision
from trainpipe.contract import dry
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime


def dry_run(
    config: EvaluateModelConfig, lineage: Lineage, runtime: Runtime
) -> tuple[dict[str, Any], EvaluateModelResult]:
    """A gate that passed, so a dry pipeline goes on to register_model."""
    dry.report(config.output_dir)
    decision = GateDecision(
        passed=True,
        reasons=["dry run: nothing scored"],
        thresholds=dict(getattr(config, "thresholds", None) or {}),
        metrics={},
        model_name=getattr(config, "model_name", None),
        alias=getattr(config, "alias", None),
    )
    roc: dict[str, list[float]] = {"fpr": [], "tpr": [], "thresholds": []}
    return {}, dry.stub(EvaluateModelResult, lineage=lineage, decision=decision, metrics={}, roc_curve=roc)
