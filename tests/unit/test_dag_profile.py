"""The hardware profile reaches the reference DAGs' tasks, as it reaches the KFP pipeline's: retries, backoff, the
timeouts (train_model's its own) and the bound on preemptions that spend no retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.unit


@pytest.fixture
def dagbag(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    profile = tmp_path / "profile.yaml"
    profile.write_text(
        yaml.safe_dump(
            {"name": "site", "retries": 1, "retry_backoff_s": 7, "timeout_s": 120, "train_timeout_s": 900}
            | {"max_preemptions": 2}
        )
    )
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({"data": str(tmp_path / "d.csv"), "profile": str(profile), "schedule": None}))
    monkeypatch.setenv("TRAINPIPE_CONFIG", str(config))
    monkeypatch.setenv("TRAINPIPE_AIRFLOW_MODE", "local")
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag


def test_every_task_takes_the_profiles_retries_backoff_and_timeouts(dagbag):
    trainpipe_tasks = 0
    for dag in dagbag.dags.values():
        for task in dag.tasks:
            if task.task_id == "train_model":
                assert task.execution_timeout == timedelta(seconds=900)
                assert task.max_preemptions == 2
            elif task.task_id not in ("approve",):
                assert task.execution_timeout == timedelta(seconds=120), task.task_id
            if task.task_id not in ("gate", "new_snapshot", "retrain"):  # decisions: they retry nothing
                assert task.retries == 1 and task.retry_delay == timedelta(seconds=7), task.task_id
                trainpipe_tasks += 1
    assert trainpipe_tasks >= 8


def test_a_runs_override_of_one_train_setting_keeps_the_others(dagbag):
    """The DAG's docstring says a run's conf overrides its params; ``{"train": {"epochs": 2}}`` replaced the
    whole train param (Airflow merges one level deep) and the other settings' templates failed to render
    (StrictUndefined). Each takes the config's value unless the run names it."""
    import json

    import jinja2

    task = dagbag.dags["trainpipe_training"].get_task("train_model")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)

    def rendered(setting: str, train: dict) -> object:
        return json.loads(env.from_string(task.settings[setting]).render(params={"train": train}))

    assert rendered("epochs", {"epochs": 2}) == 2
    assert rendered("batch_size", {"epochs": 2}) == 64 and rendered("max_cost", {"epochs": 2}) is None
    assert rendered("train_config", {"epochs": 2}) == {} and rendered("train_config", {"train_config": {"b": 1}})
    assert rendered("batch_size", {"batch_size": 8}) == 8


def test_an_unknown_or_mistyped_override_is_refused_before_the_first_step(dagbag):
    from trainpipe.pipelines.dag_settings import conf_problem

    dag = dagbag.dags["trainpipe_training"]
    params = dict(dag.params)
    good = {"train": {"epochs": 2, "train_config": {"momentum": 0.5, "hidden_units": [8]}}}
    assert conf_problem(good, params) is None
    # a new user's misspelt train_config key ran three steps before train_model refused it: the function's typed
    # config (builtin:mlp's here) gives the keys an override may name; each refusal is one line (issue 53)
    for bad in ({"epoch": 2}, {"epochs": "two"}, {"backend": "mpi"}, {"train_config": {"learning_rat": 0.1}}):
        line = conf_problem({"train": bad}, params)
        assert line and line.startswith("conf: train") and "\n" not in line, (bad, line)


def test_a_function_without_a_typed_config_takes_any_train_config_override(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "freeform.py").write_text("def train(ctx, config: dict):\n    pass\n")
    config = tmp_path / "pipeline.yaml"
    settings = {"data": str(tmp_path / "d.csv"), "schedule": None, "train": {"train_function": "freeform:train"}}
    config.write_text(yaml.safe_dump(settings))
    monkeypatch.setenv("TRAINPIPE_CONFIG", str(config))
    monkeypatch.syspath_prepend(str(tmp_path))
    bag = DagBag(dag_folder=str(REPO / "dags" / "training_dag.py"))
    assert not bag.import_errors, bag.import_errors
    from trainpipe.pipelines.dag_settings import conf_problem

    params = dict(bag.dags["trainpipe_training"].params)
    assert conf_problem({"train": {"train_config": {"anything": [1], "z": {"a": 1}}}}, params) is None


def test_a_jinja_literal_renders_back_to_its_json_value():
    import json

    import jinja2
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from trainpipe.pipelines.dag_settings import jinja_literal

    env = jinja2.Environment()
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
    values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(), c, max_size=3))

    @settings(max_examples=150, deadline=None)
    @given(values)
    def check(value):
        got = env.from_string("{{ (" + jinja_literal(value) + ") | tojson }}").render()
        assert json.loads(got) == value

    check()
    # a team's dict keeps its order in the literal (what the step receives is rendered from it)
    assert env.from_string("{{ (" + jinja_literal({"b": 1, "a": None}) + ").keys() | list }}").render() == "['b', 'a']"
