"""Airflow 3 face of evaluate_model. Holds no logic: it runs the entrypoint."""

from trainpipe.components.evaluate_model.spec import EvaluateModelConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class EvaluateModelOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.evaluate_model` on the worker; the result JSON is the XCom value."""

    component = "evaluate_model"
    config = EvaluateModelConfig
