"""optimize_model's own tests: its contract (entrypoint, faces, folder). Its export, quantization and pruning parts are
tested beside this file.
"""

from __future__ import annotations

from tests.helpers.component_contract import ComponentContract


class TestOptimizeModelContract(ComponentContract):
    name = "optimize_model"
