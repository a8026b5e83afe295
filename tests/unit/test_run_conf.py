"""A run's conf, checked at every level before its first task (issue 53 §4): ``{"epochs": 2}`` and
``{"trian": {...}}`` were accepted and ignored, a nested typo refused at trigger with jsonschema's 655-line dump
of the ``train`` schema. Each is now refused in one line naming the key and what it may be."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def dags(tmp_path_factory):
    """The training and retrain DAGs as a deployment parses them (local mode)."""
    tmp = tmp_path_factory.mktemp("conf")
    (tmp / "pipeline.yaml").write_text(yaml.safe_dump({"data": "raw.csv", "train": {"epochs": 3}}))
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINPIPE_CONFIG", str(tmp / "pipeline.yaml"))
    mp.setenv("TRAINPIPE_AIRFLOW_MODE", "local")
    mp.setenv("AIRFLOW_HOME", str(tmp))
    loaded = {}
    try:
        for name in ("training_dag", "retrain_dag"):
            spec = importlib.util.spec_from_file_location(f"conf_test_{name}", REPO / "dags" / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            loaded[name] = module.dag
        yield loaded
    finally:
        mp.undo()
        for name in [n for n in sys.modules if n.startswith("conf_test_")]:
            del sys.modules[name]


def _first_task_says(dag, conf) -> str | None:
    """What the DAG's first task does before it runs, given the run's conf: None, or its one-line refusal."""
    from airflow.sdk.exceptions import AirflowFailException

    first = next(t for t in dag.tasks if not t.upstream_task_ids)
    context = {"dag": dag, "dag_run": SimpleNamespace(conf=conf), "task": first}
    try:
        first._pre_execute_hook(context)
    except AirflowFailException as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("dag_name", ["training_dag", "retrain_dag"])
def test_a_conf_the_dag_takes_passes(dags, dag_name):
    dag = dags[dag_name]
    assert _first_task_says(dag, {}) is None and _first_task_says(dag, None) is None
    assert _first_task_says(dag, {"train": {"epochs": 2}, "model_name": "other"}) is None
    assert _first_task_says(dag, {"train": {"train_config": {"hidden_units": [32]}}}) is None


@pytest.mark.parametrize(
    ("conf", "said"),
    [
        (
            {"epochs": 2},
            "conf: 'epochs' is not a param of trainpipe_training (its params: ",
        ),
        ({"trian": {"epochs": 2}}, "conf: 'trian' is not a param of trainpipe_training (its params: "),
        ({"train": {"epoch": 2}}, "conf: train: 'epoch' is not a train setting (its settings: "),
        ({"train": {"epochs": "two"}}, "conf: train.epochs: Input should be a valid integer"),
        ({"train": {"epochs": 0}}, "conf: train.epochs: Input should be greater than or equal to 1"),
        ({"train": 2}, "conf: train: is int, not an object of train settings"),
        ({"optimize": {"quantise": True}}, "conf: optimize: 'quantise' is not a optimize setting"),
        (
            {"train": {"train_config": {"hiden": [32]}}},
            "conf: train.train_config.hiden: unknown key (BuiltinConfig takes ",
        ),
    ],
)
def test_a_conf_the_dag_does_not_take_is_refused_in_one_line_at_the_first_task(dags, conf, said):
    line = _first_task_says(dags["training_dag"], conf)
    assert line is not None and said in line, line
    assert "\n" not in line and len(line) < 1500, line
    if "is not a param" in line:  # it names the keys the DAG takes
        assert "train" in line.split("its params: ")[1] and "model_name" in line


def test_a_train_setting_at_the_top_is_pointed_inside_train(dags):
    line = _first_task_says(dags["training_dag"], {"epochs": 2})
    assert line.endswith('a train setting goes inside train: {"train": {"epochs": ...}}'), line


def test_the_retrain_dag_refuses_a_setting_it_does_not_take(dags):
    """The retrain DAG starts from a snapshot: ``data`` is no param of it, and its first task (the gate on the
    asset events) refuses it as the training DAG's first step would refuse an unknown one."""
    line = _first_task_says(dags["retrain_dag"], {"data": "other.csv"})
    assert line is not None and line.startswith("conf: 'data' is not a param of trainpipe_retrain_on_new_data"), line


def test_every_task_checks_it_and_the_nested_param_carries_no_schema_to_dump(dags):
    """Whatever task runs first (a cleared task, a DAG's own order), it checks the conf; the trigger's own check
    of ``train`` is only that it is an object, so Airflow has no schema to dump."""
    for dag in dags.values():
        assert all(t._pre_execute_hook is not None for t in dag.tasks)
        schema = dag.params.get_param("train").schema
        assert set(schema) <= {"type", "description"}, schema
