"""Airflow 3 face of optimize_model. Holds no logic: it runs the entrypoint."""

from trainpipe.components.optimize_model.spec import OptimizeModelConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class OptimizeModelOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.optimize_model` on the worker; the result JSON (``selected``,
    every variant's figures) is the XCom value."""

    component = "optimize_model"
    config = OptimizeModelConfig
