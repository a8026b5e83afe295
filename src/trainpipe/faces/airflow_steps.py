"""Rules across the tasks of a DAG made of trainpipe's operators, checked when a task joins the DAG (so
when the DAG file is imported): what one step must share with the step whose output it reads. Both
modes' operators (the local one and the pod) call it; it imports neither."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trainpipe.contract.entrypoint import check_same_as_producer, output_fields, producer_settings
from trainpipe.contract.errors import InputError


def templated(value: Any) -> bool:
    """Whether a setting (or anything inside it) is a Jinja template, known only when the task renders it."""
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, dict):
        return any(templated(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(templated(v) for v in value)
    return False


def as_written(env: Any) -> Any:
    """The Jinja environment ``env`` with its ``tojson`` filter keeping every mapping's keys in their order.

    A DAG passes a setting from its params as ``{{ params.<name> | tojson }}``, and Jinja's ``tojson`` sorts
    keys by default: a team's ``train_config`` reached its function with its keys sorted at every level. The
    values are JSON's as ever (big integers, floats with exponents, unicode); only the order is kept.
    """
    env.policies["json.dumps_kwargs"] = {**env.policies.get("json.dumps_kwargs", {}), "sort_keys": False}
    return env


def _step_of(task: Any) -> tuple[Any, dict[str, Any]] | None:
    """A task's component operator class and settings, for a trainpipe task in either mode (the operator
    itself, or a pod that names it); None for any other task."""
    cls = getattr(task, "operator_cls", None) or type(task)
    settings = getattr(task, "settings", None)
    config = getattr(cls, "config", None)
    if isinstance(config, type) and issubclass(config, BaseModel) and getattr(cls, "component", None):
        return (cls, settings) if isinstance(settings, dict) else None
    return None


def check_neighbours(task: Any, operator_cls: Any, settings: dict[str, Any]) -> None:
    """The settings a step must share with the step whose output it reads (register_model's ``alias`` and
    ``model_name`` with evaluate_model's, whose decision it takes: :data:`SAME_AS_PRODUCER`), checked
    against the tasks already in the DAG when this one joins it, whichever of the two comes first: two
    constants that differ fail the DAG's import instead of the run after training. A task reads another's
    output when one of its input settings is that task's output setting, text for text (a template too).

    Raises:
        TypeError: one line naming the setting and both values.
    """
    if operator_cls.config is None or not task.has_dag():
        return
    for other in task.dag.tasks:
        peer = _step_of(other) if other is not task else None
        if peer is None:
            continue
        for (consumer, given), (producer, made) in (((operator_cls, settings), peer), (peer, (operator_cls, settings))):
            assert consumer.config is not None and producer.config is not None
            outputs = {made.get(name) for name in output_fields(producer.config)} - {None}
            for field in producer_settings(consumer.config):
                if given.get(field) in outputs:
                    try:
                        check_same_as_producer(
                            consumer.component,
                            consumer.config,
                            given,
                            field,
                            producer.component,
                            producer.config,
                            made,
                            known=lambda value: not templated(value),
                        )
                    except InputError as exc:
                        raise TypeError(f"{operator_cls.__name__}: {exc}") from None
