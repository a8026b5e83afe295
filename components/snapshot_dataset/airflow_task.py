"""Airflow 3 face of snapshot_dataset. Holds no logic: it runs the entrypoint."""

from typing import Any

from trainpipe.components.snapshot_dataset.spec import SnapshotDatasetConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class SnapshotDatasetOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.snapshot_dataset` on the worker; the result JSON is the XCom value.

    With ``outlets=[dataset_asset(name)]`` it emits an asset event whose extra carries the DVC
    content hash, revision and remote, and ``changed`` (whether this snapshot committed new data);
    in Kubernetes mode the pod operator emits the same extra.
    """

    component = "snapshot_dataset"
    config = SnapshotDatasetConfig

    @classmethod
    def asset_extra(cls, result: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any] | None:
        return {
            "md5": result["md5"],
            "rev": result["rev"],
            "path": result["path"],
            "remote_url": result["remote_url"],
            "changed": bool(result["committed"]),
            "snapshot_dir": settings["output_dir"],
        }
