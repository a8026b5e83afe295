"""trainpipe's DAGs: the Airflow rendering of the declared graph (:mod:`trainpipe.pipelines.graph`: which
steps, wired how), in which mode, with which params.

``dags/`` are a few lines on top of this: each renders its slice of the graph (:func:`render`). A DAG's params
are the pipeline config's settings (``train`` and ``optimize`` nested, as in the config file), and
each task's settings are derived from its component's spec: every setting that takes a pipeline
setting (:func:`~trainpipe.pipelines.config.pipeline_names`) gets that param as a template, so
the DAGs and the KFP pipeline bind the same settings the same way. Nothing here runs at parse time
beyond reading the pipeline config (no database, no connection lookups).
"""

from __future__ import annotations

import functools
import json
import os
from datetime import timedelta
from typing import Any

from trainpipe.components.detect_drift.airflow_task import DetectDriftOperator
from trainpipe.components.evaluate_model.airflow_task import EvaluateModelOperator
from trainpipe.components.optimize_model.airflow_task import OptimizeModelOperator
from trainpipe.components.profile_training.airflow_task import ProfileTrainingOperator
from trainpipe.components.register_model.airflow_task import RegisterModelOperator
from trainpipe.components.train_model.airflow_task import TrainModelOperator
from trainpipe.components.tune_model.airflow_task import TuneModelOperator
from trainpipe.contract.entrypoint import input_fields, output_fields
from trainpipe.faces.airflow_operator import GateOperator, TrainpipeOperator, component_task
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


def switches(
    include: tuple[str, ...] = ("profile_training",),
    optimizes: bool = False,
    approval_timeout: timedelta | None = None,
    tune: dict[str, Any] | None = None,
) -> list[str]:
    """The optional steps' switches (:data:`~trainpipe.pipelines.graph.SWITCHES`) these settings turn on."""
    return graph.switches(
        tune=bool(tune),
        profile="profile_training" in include,
        optimize=optimizes,
        approval=approval_timeout is not None,
    )


def render(
    step: Any,
    chosen: list[graph.Step],
    *,
    snapshot_dir: str,
    run_dir: str,
    asset: Any = None,
    approval_timeout: timedelta | None = None,
    tune: dict[str, Any] | None = None,
    mapped: Any = None,
    roots: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Airflow rendering of the declared graph's ``chosen`` steps (:func:`~trainpipe.pipelines.graph.steps`):
    each step a task in the DAG's mode (``step(operator_cls, task_id, paths, **kwargs)``: :meth:`DagSettings.step`)
    given its inputs as the producers' output folders (the snapshot's is ``snapshot_dir``, which may be a
    template), each condition a :class:`GateOperator` after the step that decides it, wired as
    :func:`~trainpipe.pipelines.graph.edges` says; ``roots`` maps a step to a task made before it. Returns
    the tasks by id."""
    tasks: dict[str, Any] = {task.task_id: task for task in (roots or {}).values()}
    for s in chosen:
        if s.name in tasks:  # made with the step before it (the approval's three)
            continue
        if s.fan_out:
            tasks[f"{s.name}_workers"], tasks[s.name] = tune_steps(
                step, mapped, tune or {}, snapshot_dir=snapshot_dir, run_dir=run_dir
            )
        elif s.name == "approve":
            made_now = approval_steps(tasks["register_model"], approval_timeout or timedelta(0))
            tasks.update({t.task_id: t for t in made_now})
        else:
            paths = _paths(s, snapshot_dir=snapshot_dir, run_dir=run_dir)
            if s.held_by_approval and approval_timeout is not None:
                paths["move_alias"] = False
            tasks[s.name] = step(_operators()[s.name], s.name, paths, **_step_kwargs(s.name, asset))
        for cond in graph.CONDITIONS.values():
            if cond.decided_by == s.name and any(cond.name in c.when for c in chosen):
                gate = GATES[cond.name]
                gate = {**gate, "retries": 0}  # a gate retries nothing: its decision is data, the same on a retry
                tasks[cond.task_id] = GateOperator(task_id=cond.task_id, condition=GATE_CONDITIONS[cond.name], **gate)
    roots_ = {k: v.task_id for k, v in (roots or {}).items()}
    for before, after in sorted(graph.edges(chosen, roots_)):
        if after not in tasks[before].downstream_task_ids:
            tasks[before] >> tasks[after]
    return tasks


def _paths(s: graph.Step, *, snapshot_dir: str, run_dir: str) -> dict[str, Any]:
    """A step's artifact paths: the inputs from the steps that are always there, its output folder, then the
    inputs from optional steps (the order its command's flags take)."""

    def where(ref: str) -> str:
        producer = ref.partition(".")[0]
        if ref == graph.RAW:
            return "{{ params.data }}"
        return snapshot_dir if producer == "snapshot_dataset" else f"{run_dir}/{producer}"

    artifacts = {k: v for k, v in s.takes.items() if v not in graph.VALUES}
    always = {n for n, declared in graph.BY_NAME.items() if declared.optional is None}
    fixed = {k: where(v) for k, v in artifacts.items() if v == graph.RAW or v.partition(".")[0] in always}
    optional = {k: where(v) for k, v in artifacts.items() if k not in fixed}
    return {**fixed, "output_dir": f"{run_dir}/{s.name}", **optional}


def _step_kwargs(name: str, asset: Any) -> dict[str, Any]:
    """What one step's task takes beyond its settings (the rendering's own, not the graph's)."""
    if name == "snapshot_dataset":
        return {"outlets": [asset]}  # its event carries the DVC hash: the retrain DAG listens
    return {}


def _operators() -> dict[str, Any]:
    """Each step's operator class, looked up when a DAG renders (validate and snapshot only where a DAG has them)."""
    from trainpipe.components.snapshot_dataset.airflow_task import SnapshotDatasetOperator
    from trainpipe.components.validate_data.airflow_task import ValidateDataOperator

    return {
        "validate_data": ValidateDataOperator,
        "snapshot_dataset": SnapshotDatasetOperator,
        "detect_drift": DetectDriftOperator,
        "train_model": TrainModelOperator,
        "profile_training": ProfileTrainingOperator,
        "evaluate_model": EvaluateModelOperator,
        "optimize_model": OptimizeModelOperator,
        "register_model": RegisterModelOperator,
    }


def model_steps(
    step: Any,
    *,
    snapshot_dir: str,
    run_dir: str,
    include: tuple[str, ...] = ("profile_training",),
    optimizes: bool = False,
    approval_timeout: timedelta | None = None,
    tune: dict[str, Any] | None = None,
    mapped: Any = None,
) -> tuple[Any, Any]:
    """train → (profile ∥ evaluate) → gate → (optimize →) register on a snapshot, as both DAGs run them: the
    declared graph (:mod:`~trainpipe.pipelines.graph`) from tune_model on, rendered (:func:`render`).

    ``include`` names the optional steps (without profile_training, register_model records no training
    profile); ``optimizes`` puts optimize_model after the gate, and register_model registers its variant
    beside the model. ``approval_timeout`` (the config's require_approval) has register_model register the
    challenger only, then waits for a person's answer in Airflow's approval task: approved,
    ``promote_model`` moves the alias; rejected or timed out, ``record_rejection`` notes it. ``tune``
    (:meth:`PipelineConfig.tune_settings`) puts tune_model first: its workers mapped over one study
    (``mapped(operator_cls, task_id, paths, variants)``: dynamic task mapping), then the step that
    summarizes it, whose best settings the training takes. Returns the first and the last task.
    """
    on = switches(include, optimizes, approval_timeout, tune)
    chosen = graph.steps(on, "airflow", start="tune_model")
    tasks = render(
        step,
        chosen,
        snapshot_dir=snapshot_dir,
        run_dir=run_dir,
        approval_timeout=approval_timeout,
        tune=tune,
        mapped=mapped,
    )
    return tasks[f"{chosen[0].name}_workers" if chosen[0].fan_out else chosen[0].name], tasks[chosen[-1].name]


def tune_steps(step: Any, mapped: Any, tune: dict[str, Any], *, snapshot_dir: str, run_dir: str) -> list[Any]:
    """tune_model's workers (mapped, each with ``summarize`` off) on one study, then the step that
    summarizes it. Without a ``storage`` the study is SQLite in the run's folder, which the workers share
    on this machine (a PostgreSQL URL where the workers run on several)."""
    out = f"{run_dir}/tune_model"
    settings = {k: v for k, v in tune.items() if k != "workers" and v is not None}
    settings.setdefault("storage", f"sqlite:///{out}/study.db")
    timeout = {"execution_timeout": timedelta(hours=12)}
    workers = mapped(
        TuneModelOperator,
        "tune_model_workers",
        {"data": snapshot_dir, "output_dir": f"{out}-worker", **settings, "summarize": False},
        [{"worker": i, "output_dir": f"{out}-worker-{i}"} for i in range(tune["workers"])],
        **timeout,
    )
    summary = step(TuneModelOperator, "tune_model", {"data": snapshot_dir, "output_dir": out, **settings}, **timeout)
    workers >> summary
    return [workers, summary]


def approval_steps(register: Any, timeout: timedelta) -> tuple[Any, Any, Any]:
    """register_model (challenger only) → approve (Airflow's ApprovalOperator: a person answers in
    the UI's Required Actions or through the REST API; "Reject" when ``timeout`` passes) →
    promote_model (approved) → record_rejection (runs only when promote_model was skipped). Both
    run ``trainpipe promote`` with the answer: who, and the reason typed into the form, go into the
    version's tags and the audit log. Returns the three tasks."""
    from airflow.sdk import Param

    from trainpipe.faces.airflow_approval import TrainpipeApprovalOperator
    from trainpipe.faces.airflow_operator import PromoteOperator

    version = "{{ ti.xcom_pull(task_ids='register_model')['version'] }}"
    approve = TrainpipeApprovalOperator(
        task_id="approve",
        subject=f"Promote {{{{ params.model_name }}}} version {version} to {{{{ params.alias }}}}?",
        body=(
            "The gate passed: {{ ti.xcom_pull(task_ids='evaluate_model')['decision']['reasons'] | join('; ') }}.\n\n"
            f"`trainpipe lineage models:/{{{{ params.model_name }}}}/{version}` shows its chain back to the raw data. "
            "Approve to move the serving alias to it; Reject (the default when nobody answers in time) leaves it a "
            "challenger."
        ),
        defaults="Reject",
        response_timeout=timeout,
        execution_timeout=None,
        retries=0,
        params={
            "reason": Param("", type="string", description="why (goes into the model version's tags and the audit log)")
        },
        doc_md="A person approves before the serving alias moves (the config's require_approval).",
    )
    settings = {
        "model_uri": f"models:/{{{{ params.model_name }}}}/{version}",
        "alias": "{{ params.alias }}",
        "tracking_uri": "{{ params.tracking_uri }}",
    }
    promote = PromoteOperator(
        task_id="promote_model", settings=settings, doc_md="`trainpipe promote` with the approver's answer."
    )
    rejected = PromoteOperator(
        task_id="record_rejection",
        settings=settings,
        reject=True,
        trigger_rule=graph.BY_NAME["record_rejection"].trigger_rule,
        doc_md="Records a rejection (or the timeout's default) on the version and in the audit log; moves nothing.",
    )
    register >> approve >> promote >> rejected
    return approve, promote, rejected


#: The gate tasks' own settings, by condition.
GATES: dict[str, dict[str, Any]] = {
    "retrain": {
        "retries": 0,
        "doc_md": "Continue only when detect_drift decided to retrain; a skip logs why in one line.",
    },
    "gate-passed": {"doc_md": "Continue only when evaluate_model's decision passed."},
}


def drift_says_retrain(ti: Any = None, **_: Any) -> bool:
    """Gate condition: detect_drift's decision. The reason goes into the task log as one line (the
    audit log has detect_drift's own record of it)."""
    result = ti.xcom_pull(task_ids="detect_drift") or {}
    retrain = bool(result.get("retrain"))
    reason = (result.get("reasons") or ["detect_drift returned no decision"])[0]
    print(f"trainpipe: {'retraining' if retrain else 'not retraining'}: {reason}", flush=True)  # the task log
    return retrain


def dataset_asset(dataset_name: str) -> Any:
    """The Airflow Asset a dataset's snapshots update (snapshot_dataset emits it with the DVC hash)."""
    from airflow.sdk import Asset

    return Asset(
        name=f"trainpipe-dataset-{dataset_name}", uri=f"trainpipe://datasets/{dataset_name}", group="trainpipe"
    )


def _made_at(event: Any) -> str:
    """When an event's snapshot was made (its extra's ``made_at``, else the event's own timestamp), as
    sortable text: Airflow hands a run its triggering events in no promised order."""
    made = (getattr(event, "extra", None) or {}).get("made_at")
    stamp: Any = getattr(event, "timestamp", None)
    return str(made or (stamp.isoformat() if hasattr(stamp, "isoformat") else stamp or ""))


def _why_not(extra: dict[str, Any]) -> str | None:
    """Why an event's snapshot is no new data for the retraining DAG to weigh, or None: it is."""
    if not extra.get("snapshot_dir"):
        return "the triggering asset event names no snapshot_dir (it was not posted by snapshot_dataset)"
    if not extra.get("changed"):
        return f"the snapshot {extra['snapshot_dir']} holds no new data (its content hash is unchanged)"
    if extra.get("trained_by"):
        return f"{extra['trained_by']} trains this snapshot itself"
    return None


def new_snapshot(triggering_asset_events: Any = None, **_: Any) -> str | bool:
    """Gate condition of the retraining DAG: the directory of the newest snapshot of the run's batch of events
    that holds new data (its content hash is new) and that no run trains itself (the training DAG trains its
    own: two runs training one snapshot race to move the alias), else False (skip).

    Every event of the batch is weighed, whatever the others say (the training DAG's own event or an unchanged
    one hides no ingest beside it), and each one not compared is named in the task log with why: an older new
    snapshot is the dataset's previous version (snapshot_dataset keeps one dataset per name, in versions), so
    detect_drift compares the newest, which is the data as it is now."""
    events = sorted((e for evs in (triggering_asset_events or {}).values() for e in evs), key=_made_at)
    if not events:
        return _skip(
            "the run was not triggered by a snapshot's asset event (trigger it by one, or run the training DAG)"
        )
    if len(events) == 1:
        reason = _why_not(dict(events[0].extra or {}))
        if reason:
            return _skip(reason)
        return _retrain_on(str(events[0].extra["snapshot_dir"]))
    weighed = [(e, dict(e.extra or {})) for e in events]
    new = [extra for _, extra in weighed if _why_not(extra) is None]
    chosen = new[-1] if new else None
    for i, (event, extra) in enumerate(weighed, 1):
        if extra is chosen:
            continue
        reason = _why_not(extra) or (
            f"the snapshot {extra['snapshot_dir']} is an older version of the dataset than "
            f"{chosen['snapshot_dir'] if chosen else ''}, which is compared instead"
        )
        print(f"trainpipe: skipped event {i} of {len(events)} (made at {_made_at(event)}): {reason}", flush=True)
    if chosen is None:
        return _skip(f"none of the {len(events)} asset events of this run holds a new snapshot to weigh (each above)")
    return _retrain_on(str(chosen["snapshot_dir"]), f" (the newest new data of {len(events)} asset events)")


def _retrain_on(snapshot_dir: str, note: str = "") -> str:
    print(f"trainpipe: retraining on the new snapshot {snapshot_dir}{note}", flush=True)  # the task log
    return snapshot_dir


def _skip(reason: str) -> bool:
    """A gate's skip, with its reason as one line in the task log (the steps after it are skipped)."""
    print(f"trainpipe: not retraining: {reason}", flush=True)
    return False


def gate_passed(ti: Any = None, **_: Any) -> bool:
    """Gate condition: True when evaluate_model's decision passed."""
    result = ti.xcom_pull(task_ids="evaluate_model")
    return bool(result and result.get("decision", {}).get("passed"))


#: Each condition's gate function.
GATE_CONDITIONS = {"retrain": drift_says_retrain, "gate-passed": gate_passed}


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


#: Config sections that hold a component's settings beyond the pipeline's own: the DAG passes them
#: from the nested param (``params.optimize.<name>``), where the KFP pipeline compiles them in.
SECTIONS = {"optimize_model": "optimize"}
#: The DAG params that hold sections of the config rather than a setting.
NESTED = ("workspace", "train", "optimize")


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
    comes from :mod:`trainpipe.images`.

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
        from trainpipe.profiles import get_profile

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
            from trainpipe.images import image_for

            resources = self.profile.train if trains else self.profile.default
            image = image_for(operator_cls.component, accelerated=resources.accelerated)
        env: dict[str, str] = {}
        if self.config.policy is not None:  # the config's policy travels with every step
            from trainpipe.contract.policy import ENV, to_env

            env[ENV] = to_env(self.config.policy)
        if operator_cls.component in PROFILE_STEPS:  # the hardware profile, to the steps that read it: its content
            from trainpipe.contract.runtime import PROFILE_ENV
            from trainpipe.profiles import to_env as profile_env

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
