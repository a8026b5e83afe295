"""detect_drift's own tests: its contract (entrypoint, faces, folder). Its statistics are the library's
(tests/unit/test_drift_statistics.py); its runs, tests/integration/test_detect_drift.py.
"""

from __future__ import annotations

from tests.helpers.component_contract import ComponentContract


class TestDetectDriftContract(ComponentContract):
    name = "detect_drift"
