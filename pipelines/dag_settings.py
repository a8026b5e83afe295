"""What a trainpipe DAG reads at parse time and checks at run time: the pipeline config (:class:`DagSettings`), the
DAG's params (the config's settings, ``train`` and ``optimize`` nested), each task's settings as those params'
templates, the hardware profile's retries and timeouts, and the check of a run's conf before its first task."""

from __future__ import annotations

import functools
import json
import os
from datetime import timedelta
from typing import Any

from trainpipe.contract.entrypoint import input_fields, output_fields
from trainpipe.faces.airflow_operator import TrainpipeOperator, component_task
from trainpipe.pipelines import graph
from trainpipe.pipelines.config import (
    NOT_PIPELINE_PARAMETERS,
    PROFILE_STEPS,
    OptimizeSettings,
    PipelineConfig,
    TrainSettings,
    load_pipeline_config,
    pipeline_names,
)
from trainpipe.pipelines.dag_gates import dataset_asset


def _trains(component: str) -> bool:
    """Whether the graph declares the step a training (the profile's training resources, timeout and queue)."""
    declared = graph.BY_NAME.get(component)
    return bool(declared and declared.trains)


def default_args(profile: Any) -> dict[str, Any]:
    """Every task's retries, capped exponential backoff and timeout: the hardware profile's ``retries``,
    ``retry_backoff_s`` and ``timeout_s`` (train_model takes ``train_timeout_s``: :meth:`DagSettings.step`),
    as the KFP pipeline applies them."""
    return {
        "retries": profile.retries,
        "retry_delay": timedelta(seconds=profile.retry_backoff_s),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=10),
        "execution_timeout": timedelta(seconds=profile.timeout_s),
    }


#: Where one DAG run keeps its step outputs.
RUN_DIR = "{{ params.workspace }}/airflow-runs/{{ run_id | replace(':', '_') | replace('+', '_') }}"


#: The DAG params that hold sections of the config rather than a setting.
NESTED = ("workspace", "train", "optimize")


#: Config sections that hold a component's settings beyond the pipeline's own (the graph's ``section``): the DAG
#: passes them from the nested param (``params.optimize.<name>``), where the KFP pipeline compiles them in.
SECTIONS = {s.name: s.section for s in graph.STEPS if s.section in NESTED}


#: The models whose settings a nested DAG param holds (its schema: a run's override names some of them).
SECTION_MODELS: dict[str, Any] = {"train": TrainSettings, "optimize": OptimizeSettings}


def _param(path: str, default: Any = None, nested: bool = False) -> str:
    """The template of a DAG param, as JSON (the entrypoint reads every flag's value as YAML/JSON). A setting
    of a nested param falls back to the config's value: a run's ``conf {"train": {"epochs": 2}}`` replaces
    the whole ``train`` param (Airflow merges a run's conf one level deep), and the settings it does not
    name keep the config's."""
    if nested:
        return "{{ params." + path + " | default(" + jinja_literal(default) + ") | tojson }}"
    return "{{ params." + path + " | tojson }}"


def jinja_literal(value: Any) -> str:
    """A JSON value as a Jinja expression that evaluates to it (``none``, ``true``, dicts in their order)."""
    if value is None or isinstance(value, bool):
        return {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {jinja_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(jinja_literal(v) for v in value) + "]"
    return json.dumps(value)  # numbers, and strings with JSON's escapes, which Jinja's string literals read


def section_param(name: str, value: dict[str, Any]) -> Any:
    """A nested DAG param (``train``, ``optimize``): an object at trigger, its settings checked by
    :func:`conf_problem` before the run's first task runs. Not a JSON schema of its settings: Airflow refuses a
    trigger that fails one with jsonschema's whole report (the schema dumped, 655 lines for ``train``), where a
    refusal is one line."""
    from airflow.sdk import Param

    model = SECTION_MODELS[name]
    return Param(
        value, type="object", description=f"overrides of the config's {name} settings: {', '.join(model.model_fields)}"
    )


def conf_problem(conf: Any, params: Any, dag_id: str = "the DAG") -> str | None:
    """What is wrong with a run's conf, in one line, or None: each key must be one of the DAG's ``params``, a
    nested one's (``train``, ``optimize``) a setting of its section, and each value of its setting's type (a
    ``train_config`` the training function's typed config takes). Airflow accepts any top-level key at trigger
    (``{"epochs": 2}`` became a param nothing reads) and checks a nested one only against a JSON schema."""
    from pydantic import ValidationError

    if not isinstance(conf, dict) or not conf:
        return None
    for key, value in conf.items():
        if key not in params:
            hint = ""
            if key in TrainSettings.model_fields and "train" in params:
                hint = f'; a train setting goes inside train: {{"train": {{"{key}": ...}}}}'
            return f"conf: {key!r} is not a param of {dag_id} (its params: {', '.join(params)}){hint}"
        field = PipelineConfig.model_fields.get(key)
        if key in SECTION_MODELS:
            problem = _section_problem(key, value, params)
            if problem:
                return f"conf: {problem}"
        elif field is not None:
            try:
                _check_value(field, value)
            except ValidationError as exc:
                return f"conf: {key}: {exc.errors()[0]['msg']} (got {json.dumps(value)})"
    return None


def _section_problem(name: str, value: Any, params: Any) -> str | None:
    """A nested param's override: an object of its section's settings, each of its type."""
    from pydantic import ValidationError

    model = SECTION_MODELS[name]
    if not isinstance(value, dict):
        return f"{name}: is {type(value).__name__}, not an object of {name} settings"
    for key, setting in value.items():
        field = model.model_fields.get(key)
        if field is None:
            return f"{name}: {key!r} is not a {name} setting (its settings: {', '.join(model.model_fields)})"
        try:
            _check_value(field, setting)
        except ValidationError as exc:
            return f"{name}.{key}: {exc.errors()[0]['msg']} (got {json.dumps(setting)})"
    if name == "train" and isinstance(value.get("train_config"), dict):
        from trainpipe.contract.errors import InputError
        from trainpipe.training import config_types

        default = params["train"] if isinstance(params["train"], dict) else {}
        function = str(value.get("train_function") or default.get("train_function") or "builtin:mlp")
        try:
            config_types.check(function, value["train_config"], where="train.train_config")
        except InputError as exc:
            return str(exc)
    return None


def _check_value(field: Any, value: Any) -> None:
    """A value against its setting's type and constraints (``ge``, a pattern ...), as the setting's model does."""
    from typing import Annotated

    from pydantic import TypeAdapter

    kind: Any = Annotated[field.annotation, field] if field.metadata else field.annotation  # its constraints
    TypeAdapter(kind).validate_python(value)


def check_run_conf(context: Any) -> None:
    """Every task's ``pre_execute`` in a trainpipe DAG: a run whose conf :func:`conf_problem` refuses fails its
    first task, not retried, with that one line (the trigger cannot refuse it: Airflow's api-server runs no DAG
    code, and takes any top-level key).

    Raises:
        AirflowFailException: the one line.
    """
    from airflow.sdk.exceptions import AirflowFailException

    dag = context.get("dag")
    conf = getattr(context.get("dag_run"), "conf", None)
    problem = conf_problem(conf, dict(getattr(dag, "params", None) or {}), getattr(dag, "dag_id", "the DAG"))
    if problem:
        raise AirflowFailException(problem)


class DagSettings:
    """What a trainpipe DAG file reads at parse time: the pipeline config named by
    ``TRAINPIPE_CONFIG`` (a small YAML file; no database or connection lookups), the mode
    (``TRAINPIPE_AIRFLOW_MODE``: local or kubernetes) and the hardware profile; each task's image
    comes from :mod:`trainpipe.services.images`.

    Args:
        exclude: Config settings this DAG does not take as params (its steps that read them are not in it).
    """

    def __init__(self, exclude: tuple[str, ...] = ()) -> None:
        path = os.environ.get("TRAINPIPE_CONFIG")
        if not path:  # not a DAG on <cwd>/data.csv, a SQLite MLflow in the working directory and @daily
            raise ImportError(
                "TRAINPIPE_CONFIG is not set: every scheduler, dag-processor and worker process needs the path of "
                "the pipeline config (README: Deploying the DAGs)"
            )
        self.config = load_pipeline_config(path)
        self.mode = os.environ.get("TRAINPIPE_AIRFLOW_MODE", "local")
        self.exclude = exclude
        if self.config.policy is not None:
            self.config.check_policy()  # at parse time, as the KFP compiler does: a broken DAG names the setting

    @property
    def approval_timeout(self) -> timedelta | None:
        """How long the approval task waits (the config's require_approval), or None: no approval step."""
        return timedelta(hours=self.config.approval_timeout_hours) if self.config.require_approval else None

    @property
    def asset(self) -> Any:
        """The Asset of the config's dataset: what the snapshot tasks update and the retrain DAG listens to."""
        return dataset_asset(str(self.config.model_dump(include={"dataset_name"})["dataset_name"]))

    @property
    def optimizes(self) -> bool:
        """Whether the DAG runs optimize_model (the config's ``optimize.enabled``, else the profile's)."""
        return self.config.optimizes()

    @property
    def default_args(self) -> dict[str, Any]:
        """The DAG's default args, from the hardware profile (:func:`default_args`), and the check of a run's
        conf before each task (:func:`check_run_conf`)."""
        return {**default_args(self.profile), "pre_execute": check_run_conf}

    @functools.cached_property
    def profile(self) -> Any:
        """The hardware profile: pods' resources and images in kubernetes mode, Celery queues in both."""
        from trainpipe.services.profiles import get_profile

        return get_profile(self.config.profile)

    def params(self) -> dict[str, Any]:
        """The DAG's params (overridable per run): the config's settings the KFP pipeline takes as
        parameters, with ``train`` and ``optimize`` nested as in the config file, and the workspace."""
        names = [n for n in PipelineConfig.model_fields if n not in NOT_PIPELINE_PARAMETERS or n in NESTED]
        values = self.config.model_dump(mode="json", include=set(names))
        values["optimize"] = self.config.optimize.settings()
        return {k: values[k] for k in names if k not in self.exclude}

    def dag_params(self) -> dict[str, Any]:
        """:meth:`params` as the DAG takes them: the nested ones with their settings' schema."""
        return {k: section_param(k, v) if k in SECTION_MODELS else v for k, v in self.params().items()}

    def templates(self, operator_cls: type[TrainpipeOperator]) -> dict[str, Any]:
        """Every setting of the step that takes a DAG param, as that param's template."""
        config = operator_cls.config
        assert config is not None, f"{operator_cls.__name__} declares no config"  # every component operator does
        paths = set(input_fields(config)) | set(output_fields(config))
        settings = [n for n in config.model_fields if n not in paths]
        values = self.params()
        out: dict[str, Any] = {}
        for setting, wanted in pipeline_names(operator_cls.component, settings).items():
            if wanted in TrainSettings.model_fields and "train" in values:
                out[setting] = _param(f"train.{wanted}", values["train"].get(wanted), nested=True)
            elif wanted in values:
                out[setting] = _param(wanted)
        section = SECTIONS.get(operator_cls.component)
        if section in values:
            for setting, default in values[section].items():
                out.setdefault(setting, _param(f"{section}.{setting}", default, nested=True))
        declared = graph.BY_NAME.get(operator_cls.component)
        if declared is not None and "trust" in declared.given and self.config.trusted_code():
            out["trusted_packages"] = [self.config.trusted_code()]  # it rebuilds the team's model from its code
        # (tune_model's workers and summary take it in the tune settings, as on KFP: PipelineConfig.tune_settings)
        return out

    def _placement(
        self, operator_cls: type[TrainpipeOperator], task_id: str, kwargs: dict[str, Any]
    ) -> tuple[Any, Any]:
        """The task's queue, its environment (the policy; the hardware profile where the step reads it) and,
        on Kubernetes, its resources and image."""
        trains = _trains(operator_cls.component)
        kwargs.setdefault("queue", self.profile.train_queue if trains else self.profile.queue)
        resources = image = None
        if self.mode == "kubernetes":
            from trainpipe.services.images import image_for

            resources = self.profile.train if trains else self.profile.default
            image = image_for(operator_cls.component, accelerated=resources.accelerated)
        env: dict[str, str] = {}
        if self.config.policy is not None:  # the config's policy travels with every step
            from trainpipe.contract.policy import ENV, to_env

            env[ENV] = to_env(self.config.policy)
        if operator_cls.component in PROFILE_STEPS:  # the hardware profile, to the steps that read it: its content
            from trainpipe.contract.runtime import PROFILE_ENV
            from trainpipe.services.profiles import to_env as profile_env

            env[PROFILE_ENV] = profile_env(self.profile)
        if env:
            key = "env_vars" if self.mode == "kubernetes" else "env"
            kwargs[key] = {**env, **kwargs.get(key, {})}
        return resources, image

    def step(self, operator_cls: type[TrainpipeOperator], task_id: str, paths: dict[str, Any], **kwargs: Any) -> Any:
        """One task in this DAG's mode: its artifact paths (and constants) with its settings derived
        (:meth:`templates`), the profile's training or default resources, on the profile's Celery
        queue (training on its own: the workers on the training machines serve it)."""
        resources, image = self._placement(operator_cls, task_id, kwargs)
        settings = {**self.templates(operator_cls), **paths}
        profile = self.profile if self.mode == "kubernetes" else None
        if _trains(operator_cls.component):
            kwargs.setdefault("execution_timeout", timedelta(seconds=self.profile.train_timeout_s))
        if self.mode == "local":
            kwargs.setdefault("max_preemptions", self.profile.max_preemptions)
        return component_task(
            operator_cls, task_id, settings, mode=self.mode, image=image, resources=resources, profile=profile, **kwargs
        )

    def mapped(
        self,
        operator_cls: type[TrainpipeOperator],
        task_id: str,
        paths: dict[str, Any],
        variants: list[dict[str, Any]],
        **kwargs: Any,
    ) -> Any:
        """One step run once per variant of its settings: Airflow's dynamic task mapping
        (``.partial(...).expand(settings=...)``) on the worker; on Kubernetes one pod task per variant."""
        if self.mode == "kubernetes":
            from airflow.sdk import TaskGroup

            with TaskGroup(task_id) as group:
                for i, variant in enumerate(variants):
                    self.step(operator_cls, f"{task_id}_{i}", {**paths, **variant}, **kwargs)
            return group
        self._placement(operator_cls, task_id, kwargs)
        settings = {**self.templates(operator_cls), **paths}
        operator_cls.check_settings(settings)
        return operator_cls.partial(task_id=task_id, **kwargs).expand(settings=[{**settings, **v} for v in variants])
