"""The reference training pipeline (KFP v2), composed from the components' KFP faces.

validate → snapshot → detect drift → if retraining: train → (profile ∥ evaluate) → if the gate passed:
(optimize →) register: the KFP rendering of the graph declared in :mod:`trainpipe.pipelines.graph`
(its steps, inputs, conditions and optional steps), which the Airflow DAGs render too.
Every task has a retry policy with exponential backoff, a timeout, and the
resources of one hardware profile. Importing this module loads kfp only.
"""

# No `from __future__ import annotations`: KFP reads the real annotations.

import dataclasses
import inspect
import json
from collections.abc import Callable
from typing import Any

from kfp import dsl
from kfp.dsl import Dataset

from trainpipe import pods
from trainpipe.components.detect_drift.kfp_component import detect_drift
from trainpipe.components.evaluate_model.kfp_component import evaluate_model
from trainpipe.components.optimize_model.kfp_component import optimize_model
from trainpipe.components.profile_training.kfp_component import profile_training
from trainpipe.components.register_model.kfp_component import register_model
from trainpipe.components.snapshot_dataset.kfp_component import snapshot_dataset
from trainpipe.components.train_model.kfp_component import train_model
from trainpipe.components.tune_model.kfp_component import tune_model
from trainpipe.components.tune_model.spec import TuneModelParams
from trainpipe.components.validate_data.kfp_component import validate_data
from trainpipe.contract.runtime import PROFILE_ENV
from trainpipe.faces.kfp_face import accelerated
from trainpipe.faces.surface import REQUIRED, KfpParam, kfp_params
from trainpipe.images import RUN_AS
from trainpipe.pipelines import graph
from trainpipe.pipelines.config import pipeline_names, pipeline_parameters
from trainpipe.profiles import PROFILES, HardwareProfile, Resources
from trainpipe.profiles import to_env as profile_env

PIPELINE_NAME = "trainpipe-training"


def _configure(task: Any, res: Resources, profile: HardwareProfile, caching: bool = True) -> Any:
    task.set_cpu_request(res.cpu_request).set_cpu_limit(res.cpu_limit)
    task.set_memory_request(res.memory_request).set_memory_limit(res.memory_limit)
    if res.accelerator_type and res.accelerator_count:
        task.set_accelerator_type(res.accelerator_type).set_accelerator_limit(res.accelerator_count)
    # trainpipe's images run as UID/GID 10001; KFP's compiler adds allowPrivilegeEscalation: false,
    # drops every capability and sets seccompProfile RuntimeDefault (Pod Security "restricted").
    from kfp import kubernetes

    kubernetes.set_security_context(task, run_as_user=RUN_AS, run_as_group=RUN_AS, run_as_non_root=True)
    # backoff_max_duration caps one wait at ten minutes (KFP's default is an hour): a service
    # that comes back is retried within minutes.
    task.set_retry(
        num_retries=profile.retries,
        backoff_duration=f"{profile.retry_backoff_s}s",
        backoff_factor=2.0,
        backoff_max_duration="600s",
    )
    task.set_caching_options(caching)
    return task


def _kubernetes_settings(profile: HardwareProfile, trained: Any, tasks: list[Any]) -> None:
    """The profile's cluster settings through kfp-kubernetes: scheduling, images, secrets, timeouts."""
    from kfp import kubernetes

    for task in tasks:
        for key, value in profile.node_selector.items():
            kubernetes.add_node_selector(task, label_key=key, label_value=value)
        if profile.node_affinity:
            kubernetes.add_node_affinity(task, match_expressions=profile.node_affinity)
        kubernetes.set_image_pull_policy(task, profile.image_pull_policy)
        if profile.image_pull_secrets:
            kubernetes.set_image_pull_secrets(task, profile.image_pull_secrets)
        for secret, keys in sorted(profile.secrets_as_env.items()):
            # only the secret's name and keys are compiled in; Kubernetes injects the values
            kubernetes.use_secret_as_env(task, secret_name=secret, secret_key_to_env=keys)
        kubernetes.set_timeout(task, profile.train_timeout_s if task is trained else profile.timeout_s)
    # the training pod's ranks serve Prometheus metrics (the profile's metrics_port): the label the
    # PodMonitor selects and the prometheus.io annotations (KFP cannot declare container ports)
    # Kueue: every pod of the run is admitted from the team's LocalQueue (KFP cannot set priorityClassName:
    # the profile's priority class reaches them as Kueue's WorkloadPriorityClass label)
    for task in tasks:
        for key, value in pods.queue_labels(profile).items():
            kubernetes.add_pod_label(task, label_key=key, label_value=value)
    labels, annotations = pods.metrics_metadata(profile.metrics_port)
    for key, value in labels.items():
        kubernetes.add_pod_label(trained, label_key=key, label_value=value)
    for key, value in annotations.items():
        kubernetes.add_pod_annotation(trained, annotation_key=key, annotation_value=value)
    for tol in profile.tolerations:
        kubernetes.add_toleration(trained, key=tol.key, operator=tol.operator, value=tol.value, effect=tol.effect)
    for pvc, path in sorted(profile.volumes.items()):
        kubernetes.mount_pvc(trained, pvc_name=pvc, mount_path=path)


def bind(component: Any, params: dict[str, Any], **given: Any) -> Any:
    """A task of ``component`` whose settings take the pipeline's parameters (:func:`pipeline_names`),
    with ``given`` (artifacts, constants, the run id) beside them."""
    face = component.python_func
    plain = (str, int, float, bool, dict, list)  # settings, not artifacts
    names = [n for n, prm in inspect.signature(face).parameters.items() if prm.annotation in plain and n not in given]
    bound = {setting: params[wanted] for setting, wanted in pipeline_names(face.__name__, names).items()}
    return component(**bound, **given)


#: The run parameter that holds tune_model's storage where the compile leaves it to the run (the tune settings'
#: ``storage`` is ``REQUIRED``: the config's is a place on the compiling machine).
TUNE_STORAGE = KfpParam(
    "tune_storage", str, REQUIRED, False, "tune_model's study storage: a database every worker reaches (postgresql://)"
)


def pipeline_function(
    body: Callable[[dict[str, Any]], None],
    doc: str,
    defaults: dict[str, Any] | None = None,
    extra: tuple[KfpParam, ...] = (),
) -> Callable[..., None]:
    """A function KFP compiles into the pipeline: its signature is :func:`pipeline_parameters` (the
    config's settings, with their KFP types, defaults and descriptions) and ``extra``; ``body`` gets them by
    name. ``defaults`` (KFP values, :data:`REQUIRED` for none) replace those parameters' defaults."""
    declared = [*pipeline_parameters(), *extra]
    params = [dataclasses.replace(p, default=(defaults or {}).get(p.name, p.default)) for p in declared]
    params.sort(key=lambda p: p.default is not REQUIRED)  # required first: a Python signature's order

    def training_pipeline(*values: Any) -> None:
        body(dict(zip([p.name for p in params], values, strict=True)))

    training_pipeline.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                p.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if p.default is REQUIRED else p.default,
                annotation=p.type,
            )
            for p in params
        ]
    )
    described = "".join(f"\n    {p.name}: {p.description}" for p in params if p.description)
    training_pipeline.__doc__ = f"{doc}\n\nArgs:{described}"
    return training_pipeline


def _tuning(p: dict[str, Any], data: dict[str, Any], tune: dict[str, Any]) -> list[Any]:
    """tune_model's workers in a ``dsl.ParallelFor`` on one study, then the step that summarizes it."""
    # its structured settings (space, train, objectives) cross KFP as JSON text, the others as they are
    text = {p.name for p in kfp_params(TuneModelParams) if p.json_text}
    settings = {k: json.dumps(v) if k in text else v for k, v in tune.items() if k != "workers" and v is not None}
    if tune.get("storage") is REQUIRED:  # left to the run
        settings["storage"] = p[TUNE_STORAGE.name]
    with dsl.ParallelFor(items=list(range(tune["workers"])), name="tune-workers", parallelism=tune["workers"]) as i:
        worker = bind(tune_model, p, **data, **settings, worker=i, summarize=False)
    summary = bind(tune_model, p, **data, **settings, summarize=True).after(worker)
    return [worker, summary]


#: Each declared step's KFP face (:mod:`trainpipe.pipelines.graph`).
COMPONENTS = {
    "validate_data": validate_data,
    "snapshot_dataset": snapshot_dataset,
    "detect_drift": detect_drift,
    "train_model": train_model,
    "profile_training": profile_training,
    "evaluate_model": evaluate_model,
    "optimize_model": optimize_model,
    "register_model": register_model,
}


def _output(made: dict[str, list[Any]], ref: str) -> Any:
    """The output ``<step>.<name>`` of the task a step made (a fanned-out step's summary)."""
    step, _, name = ref.partition(".")
    return made[step][-1].outputs[name]


def _optimize_settings(optimize: dict[str, Any] | None, trust: dict[str, Any]) -> dict[str, Any]:
    """optimize_model's compile-time settings: the set ones, and its trusted packages with the team's, once."""
    settings = {k: v for k, v in (optimize or {}).items() if v is not None}
    packages = [*settings.pop("trusted_packages", []), *trust.get("trusted_packages", [])]
    settings["trusted_packages"] = list(dict.fromkeys(packages))
    return settings


def _settings(
    chosen: list[graph.Step], made: dict[str, list[Any]], profile: HardwareProfile, hardware: str, policy_json: str
) -> None:
    """What every task is given beside its inputs: resources, retries and caching, the hardware profile's
    content (the steps that read it: its content, not its path), the cluster's settings and the policy."""
    from trainpipe.contract.policy import ENV as POLICY_ENV

    trained = next(made[s.name][0] for s in chosen if s.trains)
    every = []
    for s in chosen:
        for task in made[s.name]:
            _configure(task, profile.train if s.trains else profile.default, profile, caching=s.cached)
            if "profile" in s.given:
                task.set_env_variable(name=PROFILE_ENV, value=hardware)
            every.append(task)
    _kubernetes_settings(profile, trained, every)
    if policy_json != "{}":
        for task in every:
            task.set_env_variable(name=POLICY_ENV, value=policy_json)


def build_pipeline(
    profile: HardwareProfile,
    policy: Any = None,
    pipeline_root: str | None = None,
    trusted_code: str = "",
    include: tuple[str, ...] = ("profile_training",),
    optimize: dict[str, Any] | None = None,
    require_approval: bool = False,
    tune: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
) -> Any:
    """The reference pipeline with one hardware profile's settings.

    Args:
        profile: Resources, scheduling and retries of every step.
        policy: A non-empty :class:`~trainpipe.contract.policy.Policy` goes onto every task as
            ``TRAINPIPE_POLICY`` (rules only: it holds no secret).
        pipeline_root: Where KFP keeps the run's artifacts (default: the cluster's).
        trusted_code: A team's package the steps that rebuild its model may import (their
            ``trusted_packages`` setting).
        include: The optional steps to run (``profile_training``; without it, register_model
            records no training profile).
        optimize: optimize_model's settings: with them, it runs between the gate and register_model,
            which registers its accepted variant beside the model (``<model_name>-onnx``).
        require_approval: register_model registers the challenger only (KFP has no human step:
            ``trainpipe promote`` moves the serving alias after a person approves).
        tune: tune_model's settings and ``workers`` (:meth:`PipelineConfig.tune_settings`): with
            them, ``workers`` tune_model tasks share one study in a ``dsl.ParallelFor``, one more
            summarizes it, and train_model takes the best trial's settings (its ``tuned`` input).
            A ``storage`` of ``REQUIRED`` is the run's parameter :data:`TUNE_STORAGE`.
        defaults: The pipeline parameters' defaults a config compiles in (KFP values by parameter name,
            :data:`~trainpipe.faces.surface.REQUIRED` for one a run must pass); the others keep the specs'.
    """
    train_op = accelerated(train_model) if profile.train.accelerated else train_model
    from trainpipe.contract.policy import to_env

    policy_json = to_env(policy) if policy is not None else "{}"
    hardware = profile_env(profile)

    faces = {**COMPONENTS, "train_model": train_op}
    on = graph.switches(
        tune=tune is not None,
        profile="profile_training" in include,
        optimize=optimize is not None,
        approval=require_approval,
    )
    chosen = graph.steps(on, "kfp")
    run_storage = tune is not None and tune.get("storage") is REQUIRED
    trust = {"trusted_packages": [trusted_code]} if trusted_code else {}  # the steps that rebuild its model
    # compile-time settings of a step beyond the pipeline's parameters; an unset one (None) is left to the face
    constants: dict[str, dict[str, Any]] = {"optimize_model": _optimize_settings(optimize, trust)}
    for held in (s for s in graph.STEPS if s.held_by_approval):  # no run parameter can skip the approval
        constants.setdefault(held.name, {})["move_alias"] = not require_approval

    def steps(p: dict[str, Any]) -> None:
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        raw = dsl.importer(artifact_uri=p["data"], artifact_class=Dataset, reimport=False)
        raw.set_display_name("raw-data")
        made: dict[str, list[Any]] = {}  # each step's tasks (a fanned-out one: its workers, then the summary)
        branches: list[tuple[str, Any]] = []  # the open dsl.If contexts, outermost first
        for s in chosen:
            while [name for name, _ in branches] != list(s.when[: len(branches)]):  # leave the branches it is not in
                branches.pop()[1].__exit__(None, None, None)
            for name in s.when[len(branches) :]:  # the step's conditions not open yet: after their deciders
                decided = made[graph.CONDITIONS[name].decided_by][-1].outputs["Output"]
                branch = dsl.If(decided == True, name=name)  # noqa: E712 (KFP condition syntax)
                branch.__enter__()
                branches.append((name, branch))
            given = {k: raw.output if v == graph.RAW else _output(made, v) for k, v in s.takes.items()}
            given = {**given, "run_id": run_id, **(trust if "trust" in s.given else {})}
            if s.fan_out:
                made[s.name] = _tuning(p, given, tune or {})
            else:
                made[s.name] = [bind(faces[s.name], p, **{**given, **constants.get(s.name, {})})]
        while branches:
            branches.pop()[1].__exit__(None, None, None)
        _settings(chosen, made, profile, hardware, policy_json)

    description = "Validate, snapshot, check drift, train, profile, evaluate and register a model."
    return dsl.pipeline(name=PIPELINE_NAME, description=description, pipeline_root=pipeline_root)(
        pipeline_function(steps, description, defaults, extra=(TUNE_STORAGE,) if run_storage else ())
    )


#: The pipeline with the CPU profile: what ``trainpipe compile`` emits by default.
training_pipeline = build_pipeline(PROFILES["cpu"])
