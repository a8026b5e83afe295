"""tune_model's own tests: its contract (entrypoint, faces, folder). Its Kubeflow Trainer OptimizationJob
manifest is tested beside this file; studies run in tests/integration/test_tune_model.py.
"""

from __future__ import annotations

from tests.helpers.component_contract import ComponentContract


class TestTuneModelContract(ComponentContract):
    name = "tune_model"
