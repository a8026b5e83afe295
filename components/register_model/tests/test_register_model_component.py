"""register_model's own tests: its contract (entrypoint, faces, folder). Its registry work needs an MLflow server:
tests/integration (test_registry_lineage.py, test_governance.py).
"""

from __future__ import annotations

from tests.helpers.component_contract import ComponentContract


class TestRegisterModelContract(ComponentContract):
    name = "register_model"
