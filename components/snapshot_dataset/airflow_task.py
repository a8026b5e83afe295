"""Airflow 3 face of snapshot_dataset. Holds no logic: it runs the entrypoint."""

from trainpipe.faces.airflow_face import TrainpipeOperator


class SnapshotDatasetOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.snapshot_dataset` on the worker; the result JSON is the XCom value."""

    component = "snapshot_dataset"
