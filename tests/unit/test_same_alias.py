"""Two steps that must name one alias (evaluate_model compares with its holder, register_model moves it) are
held to it before anything runs: a KFP pipeline fails to compile, a DAG fails to import. No ``from __future__
import annotations`` here: KFP reads a pipeline function's annotations as types."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.unit


ALIASES = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,12}", fullmatch=True)
#: An alias as a step is given it: a constant, left to its spec's default (champion), or known only at run time.
GIVEN = st.one_of(ALIASES.map(lambda a: {"alias": a}), st.just({}), st.just({"alias": "late"}))


def _alias(given: dict) -> str | None:
    return None if given.get("alias") == "late" else given.get("alias", "champion")


@settings(max_examples=25, deadline=None)
@given(GIVEN, GIVEN)
def test_a_kfp_pipeline_whose_steps_name_two_aliases_fails_to_compile(evaluated, registered):
    """The gate compares with the holder of evaluate_model's alias; register_model moves its own. Two constants
    that differ (a default included) are refused when the pipeline compiles, not after training; a pipeline
    parameter on either side is the step's to check when it runs."""
    from kfp import dsl

    from trainpipe.components.evaluate_model.kfp_component import evaluate_model
    from trainpipe.components.register_model.kfp_component import register_model

    def build() -> None:
        @dsl.pipeline(name="team")
        def team(data_uri: str, late: str = "prod") -> None:
            raw = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Model)
            data = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset)
            args = {k: late if v == "late" else v for k, v in evaluated.items()}
            ev = evaluate_model(model=raw.output, data=data.output, model_name="m", **args)
            args = {k: late if v == "late" else v for k, v in registered.items()}
            register_model(model=raw.output, decision=ev.outputs["decision"], model_name="m", **args)

    mine, theirs = _alias(registered), _alias(evaluated)
    if mine is None or theirs is None or mine == theirs:
        build()
        return
    with pytest.raises(TypeError) as e:
        build()
    assert str(e.value).startswith(f"alias: register_model has {mine!r}, but evaluate_model")
    assert "\n" not in str(e.value)


@settings(max_examples=25, deadline=None)
@given(GIVEN, GIVEN, st.booleans())
def test_a_dag_whose_steps_name_two_aliases_fails_to_import(evaluated, registered, register_first):
    """The same rule in a team's DAG, whichever of the two tasks is written first: register_model's decision is
    evaluate_model's output_dir (text for text, a template too)."""
    from airflow.sdk import DAG

    from trainpipe.components.evaluate_model.airflow_task import EvaluateModelOperator
    from trainpipe.components.register_model.airflow_task import RegisterModelOperator

    run = "/runs/{{ run_id }}"
    late = {k: "{{ params.alias }}" if v == "late" else v for k, v in evaluated.items()}
    evaluate = {"model": f"{run}/m", "data": "/d", "output_dir": f"{run}/eval", "model_name": "m", **late}
    late = {k: "{{ params.alias }}" if v == "late" else v for k, v in registered.items()}
    register = {"model": f"{run}/m", "decision": f"{run}/eval", "output_dir": f"{run}/reg", "model_name": "m", **late}
    steps = [(EvaluateModelOperator, "evaluate", evaluate), (RegisterModelOperator, "register", register)]

    def build() -> None:
        with DAG("team", schedule=None):
            for cls, task_id, settings_ in steps[::-1] if register_first else steps:
                cls(task_id=task_id, settings=settings_)

    mine, theirs = _alias(registered), _alias(evaluated)
    if mine is None or theirs is None or mine == theirs:
        build()
        return
    with pytest.raises(TypeError) as e:
        build()
    assert f"alias: register_model has {mine!r}, but evaluate_model" in str(e.value) and "\n" not in str(e.value)
