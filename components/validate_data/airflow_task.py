"""Airflow 3 face of validate_data. Holds no logic: it runs the entrypoint."""

from trainpipe.components.validate_data.spec import ValidateDataConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class ValidateDataOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.validate_data` on the worker; the result JSON is the XCom value."""

    component = "validate_data"
    config = ValidateDataConfig
