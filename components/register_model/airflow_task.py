"""Airflow 3 face of register_model. Holds no logic: it runs the entrypoint."""

from trainpipe.components.register_model.spec import RegisterModelConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class RegisterModelOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.register_model` on the worker; the result JSON is the XCom value."""

    component = "register_model"
    config = RegisterModelConfig
