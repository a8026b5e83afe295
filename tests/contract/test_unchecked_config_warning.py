"""A DAG whose team function the DAG processor cannot import says its train_config went unchecked.

A new user's DAG, parsed with the team's package importable only from the folder ``airflow dags test`` ran in,
imported with no word while its misspelt ``train_config`` key failed only when the task ran (the step, a
``python -m`` process, found the package there). The README promises that such a key fails the DAG's import;
where the function cannot be imported at parse time, the import now carries a warning saying so, as
``trainpipe compile`` does, and Airflow keeps it among the DAG's captured warnings.
"""

from __future__ import annotations

import warnings
from datetime import datetime

import pytest

pytestmark = pytest.mark.contract

DAG_FILE = """
from datetime import datetime
from airflow.sdk import DAG
from trainpipe.components.train_model.airflow_task import TrainModelOperator

with DAG(dag_id="elsewhere", start_date=datetime(2026, 1, 1), schedule=None):
    TrainModelOperator(task_id="train_model", settings={
        "data": "/data/snapshot", "output_dir": "/data/model", "label_column": "y",
        "train_function": "notinstalledhere.train:train", "train_config": {"widht": 16},
    })
"""


def _operator(function: str):
    from airflow.sdk import DAG

    from trainpipe.components.train_model.airflow_task import TrainModelOperator

    with DAG(dag_id="d", start_date=datetime(2026, 1, 1), schedule=None):
        return TrainModelOperator(
            task_id="t",
            settings={
                "data": "/data/snapshot",
                "output_dir": "/data/model",
                "train_function": function,
                "train_config": {"hidden_units": [8]},
            },
        )


def test_an_unimportable_team_function_warns_that_its_config_was_not_checked():
    import trainpipe.components.train_model.airflow_task  # noqa: F401 (Airflow sets up its warnings on import)
    from trainpipe.training.config_types import UncheckedConfigWarning

    with pytest.warns(UncheckedConfigWarning, match=r"'notinstalledhere\.train:train' cannot be imported where this"):
        _operator("notinstalledhere.train:train")


def test_a_builtin_function_warns_nothing():
    import trainpipe.components.train_model.airflow_task  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _operator("builtin:mlp")


def test_airflow_keeps_the_warning_among_the_dags_parse_warnings(tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "elsewhere.py").write_text(DAG_FILE, encoding="utf-8")
    bag = DagBag(str(tmp_path))
    assert "elsewhere" in bag.dags, bag.import_errors
    said = [str(w) for ws in bag.captured_warnings.values() for w in ws]
    assert any("was not checked" in w and "notinstalledhere.train:train" in w for w in said), said
