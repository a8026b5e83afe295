"""Airflow 3 face of train_model. Holds no logic: it runs the entrypoint."""

from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class TrainModelOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.train_model` on the worker; the result JSON is the XCom value."""

    component = "train_model"
    config = TrainModelConfig
