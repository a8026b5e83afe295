"""Airflow 3 face of tune_model. Holds no logic: it runs the entrypoint."""

from trainpipe.components.tune_model.spec import TuneModelConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class TuneModelOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.tune_model` on the worker; the result JSON (the best trial,
    its settings, the Pareto front) is the XCom value. Several workers on one study: map it with
    ``.partial(...).expand(settings=[...])``, each with ``summarize: false`` and its ``worker`` index."""

    component = "tune_model"
    config = TuneModelConfig
