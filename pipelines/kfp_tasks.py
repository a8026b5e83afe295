"""The parts of the KFP rendering that are not the graph: what every task is given beside its inputs (resources,
retries with exponential backoff, caching, the cluster's settings, the hardware profile and the policy), a task
bound to the pipeline's parameters, and the pipeline function's signature. Importing it loads kfp only."""

# No `from __future__ import annotations`: KFP reads the real annotations.

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from trainpipe.contract.runtime import PROFILE_ENV
from trainpipe.faces.surface import REQUIRED, KfpParam, kfp_params
from trainpipe.pipelines import graph
from trainpipe.pipelines.config import pipeline_names, pipeline_parameters
from trainpipe.services import pods
from trainpipe.services.images import RUN_AS
from trainpipe.services.profiles import HardwareProfile, Resources


def _configure(task: Any, res: Resources, profile: HardwareProfile, caching: bool = True, cluster: bool = True) -> Any:
    task.set_cpu_request(res.cpu_request).set_cpu_limit(res.cpu_limit)
    task.set_memory_request(res.memory_request).set_memory_limit(res.memory_limit)
    if res.accelerator_type and res.accelerator_count:
        task.set_accelerator_type(res.accelerator_type).set_accelerator_limit(res.accelerator_count)
    if cluster:
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


def configure(
    chosen: list[graph.Step],
    made: dict[str, list[Any]],
    profile: HardwareProfile,
    hardware: str,
    policy_json: str,
    cluster: bool = True,
) -> None:
    """What every task is given beside its inputs: resources, retries and caching, the hardware profile's
    content (the steps that read it: its content, not its path), the cluster's settings and the policy.

    ``cluster`` False leaves out what only Kubernetes reads (kfp-kubernetes' platform settings: the security
    context, scheduling, secrets, labels, volumes): ``kfp.local``'s runners ignore a pipeline's platform spec,
    and kfp-kubernetes brings the Kubernetes client into the process that builds it."""
    from trainpipe.contract.policy import ENV as POLICY_ENV

    trained = next(made[s.name][0] for s in chosen if s.trains)
    every = []
    for s in chosen:
        for task in made[s.name]:
            _configure(task, profile.train if s.trains else profile.default, profile, caching=s.cached, cluster=cluster)
            if "profile" in s.given:
                task.set_env_variable(name=PROFILE_ENV, value=hardware)
            every.append(task)
    if cluster:
        _kubernetes_settings(profile, trained, every)
    if policy_json != "{}":
        for task in every:
            task.set_env_variable(name=POLICY_ENV, value=policy_json)


def bind(component: Any, params: dict[str, Any], **given: Any) -> Any:
    """A task of ``component`` whose settings take the pipeline's parameters (:func:`pipeline_names`),
    with ``given`` (artifacts, constants, the run id) beside them."""
    face = component.python_func
    plain = (str, int, float, bool, dict, list)  # settings, not artifacts
    names = [n for n, prm in inspect.signature(face).parameters.items() if prm.annotation in plain and n not in given]
    bound = {setting: params[wanted] for setting, wanted in pipeline_names(face.__name__, names).items()}
    return component(**bound, **given)


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


def run_parameter(step: str, section: str, setting: str, params: Any) -> KfpParam:
    """The pipeline parameter that holds a section's setting the compile leaves to the run (its value ``REQUIRED``:
    the config's is a place on the compiling machine), ``<section>_<setting>``, described as the step's setting."""
    described = {p.name: p.description for p in kfp_params(params)}
    return KfpParam(f"{section}_{setting}", str, REQUIRED, False, f"{step}'s {setting}: {described.get(setting, '')}")
