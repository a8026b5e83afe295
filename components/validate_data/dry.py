"""validate_data's dry run (:mod:`trainpipe.contract.dry`): its settings are checked, nothing is read."""

from __future__ import annotations

from typing import Any

from trainpipe.components.validate_data.spec import ValidateDataConfig, ValidateDataResult
from trainpipe.contract import dry
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime


def dry_run(
    config: ValidateDataConfig, lineage: Lineage, runtime: Runtime
) -> tuple[dict[str, Any], ValidateDataResult]:
    """What validate_data would check: the data, or the Feast training set its features would join."""
    page = dry.report(config.output_dir)
    return {}, dry.stub(ValidateDataResult, lineage=lineage, success=True, docs_index=page, docs_page=page)
