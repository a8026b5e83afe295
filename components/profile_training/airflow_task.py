"""Airflow 3 face of profile_training. Holds no logic: it runs the entrypoint."""

from trainpipe.components.profile_training.spec import ProfileTrainingConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class ProfileTrainingOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.profile_training` on the worker; the result JSON is the XCom value."""

    component = "profile_training"
    config = ProfileTrainingConfig
