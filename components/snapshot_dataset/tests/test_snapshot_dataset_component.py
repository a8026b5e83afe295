"""snapshot_dataset's own tests: its contract (entrypoint, faces, folder). Its core on real DVC remotes runs in
tests/integration (test_components.py, test_storage_policy.py).
"""

from __future__ import annotations

from tests.helpers.component_contract import ComponentContract


class TestSnapshotDatasetContract(ComponentContract):
    name = "snapshot_dataset"
