"""Airflow 3 face of detect_drift. Holds no logic: it runs the entrypoint."""

from trainpipe.components.detect_drift.spec import DetectDriftConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class DetectDriftOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.detect_drift` on the worker; the result JSON (``retrain``,
    ``reasons``) is the XCom value."""

    component = "detect_drift"
    config = DetectDriftConfig
