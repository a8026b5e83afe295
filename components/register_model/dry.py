"""register_model's dry run (:mod:`trainpipe.contract.dry`): its settings are checked, nothing is registered."""

from __future__ import annotations

from typing import Any

from trainpipe.components.register_model.spec import RegisterModelConfig, RegisterModelResult
from trainpipe.contract import dry
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime


def dry_run(
    config: RegisterModelConfig, lineage: Lineage, runtime: Runtime
) -> tuple[dict[str, Any], RegisterModelResult]:
    """No version: what it would register is in its settings (model name, alias, whether it moves it)."""
    result = dry.stub(
        RegisterModelResult,
        lineage=lineage,
        model_name=config.model_name,
        version=None,
        alias=None,
        model_uri=None,
        reason="dry run: nothing registered",
    )
    return {}, result
