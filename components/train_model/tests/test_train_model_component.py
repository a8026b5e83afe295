"""train_model's own tests: its contract (entrypoint, faces, folder). Its Slurm script and Kubernetes manifests are
tested beside this file; training itself runs in tests/integration.
"""

from __future__ import annotations

from tests.helpers.component_contract import ComponentContract


class TestTrainModelContract(ComponentContract):
    name = "train_model"
