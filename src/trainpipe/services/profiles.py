"""Hardware profiles: the cluster settings of each step, in one place.

A profile names CPU/memory requests and limits per step and, for training, the
accelerator. The KFP pipeline and the Airflow DAG both read it. Custom profiles
load from YAML with the same fields.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from trainpipe.contract.config import StrictModel, build, load_file, parse_json
from trainpipe.contract.errors import InputError
from trainpipe.services.costs import Prices


class Resources(StrictModel):
    """Kubernetes resources of one step."""

    cpu_request: str = "500m"
    cpu_limit: str = "2"
    memory_request: str = "1G"
    memory_limit: str = "4G"
    accelerator_type: str | None = Field(None, description="e.g. nvidia.com/gpu, or a MIG resource name")
    accelerator_count: int = Field(0, ge=0, le=64)

    @property
    def accelerated(self) -> bool:
        """Whether the step asks for an accelerator (and so runs in the GPU image)."""
        return bool(self.accelerator_type and self.accelerator_count)

    def as_k8s(self) -> dict[str, dict[str, str]]:
        """core/v1 ResourceRequirements; an accelerator (extended resource) is a limit and the same request."""
        requests = {"cpu": self.cpu_request, "memory": self.memory_request}
        limits = {"cpu": self.cpu_limit, "memory": self.memory_limit}
        if self.accelerator_type and self.accelerator_count:
            limits[self.accelerator_type] = requests[self.accelerator_type] = str(self.accelerator_count)
        return {"requests": requests, "limits": limits}


class Toleration(StrictModel):
    """A Kubernetes toleration (the core/v1 fields)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def as_k8s(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class HardwareProfile(StrictModel):
    """Resources for every step, and the training step's own."""

    name: str
    default: Resources = Field(default_factory=Resources)
    train: Resources = Field(default_factory=Resources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    node_affinity: list[dict[str, Any]] = Field(
        default_factory=list, description="required node affinity match expressions: [{key, operator, values}]"
    )
    service_account: str | None = Field(None, description="Kubernetes service account of the pods")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[str] = Field(default_factory=list, description="names of docker-registry secrets")
    secrets_as_env: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="Kubernetes secret name -> {key: ENV_VAR}; the value never enters the compiled pipeline (e.g. "
        "MLflow credentials)",
    )
    volumes: dict[str, str] = Field(
        default_factory=dict,
        description="PVC name -> mount path on the training step (the shared volume of multi-node jobs)",
    )
    timeout_s: int = Field(3600, ge=60, le=7 * 86_400, description="timeout of every step but training")
    train_timeout_s: int = Field(6 * 3600, ge=60, le=30 * 86_400, description="timeout of the training step")
    metrics_port: int = Field(
        9450,
        ge=0,
        le=65_535,
        description="training ranks serve Prometheus metrics on this port + their local rank (the PodMonitor scrapes "
        "the pods' metrics-N ports); 0: off",
    )
    optimize: bool = Field(
        False,
        description="serving on CPU: the pipeline runs optimize_model between the gate and register_model unless its "
        "config's "
        "optimize.enabled says otherwise",
    )
    namespace: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="the team's namespace: Airflow's pods and multi-node training jobs run there (KFP runs in its "
        "profile's namespace)",
    )
    priority_class: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description="a PriorityClass (priorityClassName of the pods trainpipe writes) and, with kueue_queue, the Kueue "
        "WorkloadPriorityClass of the same name (kueue.x-k8s.io/priority-class: KFP's pods too)",
    )
    kueue_queue: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description="the Kueue LocalQueue of the team's namespace: the kueue.x-k8s.io/queue-name label on KFP pods, "
        "Airflow pods, "
        "TrainJobs and PyTorchJobs, so Kueue admits them against the team's quota",
    )
    rank_spread: Literal["required", "preferred", "none"] = Field(
        "preferred",
        description="pod anti-affinity between the nodes of one multi-node training job: one per machine "
        "(required), where possible (preferred), or not asked",
    )
    queue: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9_.-]{1,128}$",
        description="Airflow's Celery queue for every step but training (CeleryExecutor; other executors ignore it)",
    )
    train_queue: str = Field(
        "train",
        pattern=r"^[A-Za-z0-9_.-]{1,128}$",
        description="Airflow's Celery queue for train_model: the workers on the training machines serve it",
    )
    termination_grace_s: int = Field(
        120,
        ge=1,
        le=86_400,
        description="seconds a training pod has after SIGTERM (deleted, preempted, its spot node reclaimed) to finish "
        "its step and "
        "write a checkpoint: terminationGracePeriodSeconds of training pods (Airflow's, TrainJobs', PyTorchJobs'; a "
        "KFP task pod "
        "keeps Kubernetes' 30 s, which kfp-kubernetes cannot set)",
    )
    prices: Prices | None = Field(
        None,
        description="what the enterprise charges for this hardware (per GPU-hour, CPU-core-hour, node-hour, in a "
        "currency): train_model reports each run's cost at these prices",
    )
    retries: int = Field(3, ge=0, le=20)
    retry_backoff_s: int = Field(30, ge=1, le=3600, description="first retry wait; doubles each retry, capped at 600 s")
    max_preemptions: int = Field(
        3,
        ge=0,
        le=100,
        description="preemptions (exit 75 after a checkpoint) a step is run again after without spending a retry, "
        "on Airflow; one more counts as a failure (a flapping node cannot loop forever). KFP's retry policy counts "
        "every failure, so there a preemption spends one of `retries`",
    )


PROFILES: dict[str, HardwareProfile] = {
    "cpu": HardwareProfile(
        name="cpu",
        train=Resources(cpu_request="2", cpu_limit="4", memory_request="4G", memory_limit="8G"),
    ),
    # a small business's CPU server: no accelerator, modest requests, and every model optimized for CPU serving
    "cpu-smb": HardwareProfile(
        name="cpu-smb",
        default=Resources(cpu_request="250m", cpu_limit="1", memory_request="512M", memory_limit="2G"),
        train=Resources(cpu_request="1", cpu_limit="2", memory_request="2G", memory_limit="4G"),
        optimize=True,
    ),
    "gpu": HardwareProfile(
        name="gpu",
        train=Resources(
            cpu_request="8",
            cpu_limit="16",
            memory_request="32G",
            memory_limit="64G",
            accelerator_type="nvidia.com/gpu",
            accelerator_count=1,
        ),
        node_selector={"nvidia.com/gpu.present": "true"},
        tolerations=[Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
    ),
}


def _readable(value: str) -> bool:
    """Whether ``value`` names a profile (a built-in's name, its JSON, a file) rather than none ("local")."""
    return value in PROFILES or value.lstrip().startswith("{") or value.endswith((".yaml", ".yml", ".json"))


def read_profile(value: str) -> HardwareProfile | None:
    """The profile a step was told it runs on (``TRAINPIPE_HARDWARE_PROFILE``: see :func:`get_profile`);
    None for a local run, which has no profile, and for one that cannot be read (reporting a cost, a metric
    label or a port never fails a run)."""
    if not _readable(value):
        return None
    try:
        return get_profile(value)
    except (InputError, OSError):
        return None


def metrics_port(value: str) -> int:
    """The port a training step's ranks serve metrics on under this profile; 0 (off) for a local
    run, which has no profile, and for one that cannot be read (telemetry never fails a run)."""
    profile = read_profile(value)
    return profile.metrics_port if profile is not None else 0


def prices_of(value: str) -> Prices | None:
    """The prices the step's hardware profile declares; None for a local run (no profile), an unpriced
    profile, or one that cannot be read (reporting a cost never fails a run)."""
    profile = read_profile(value)
    return profile.prices if profile is not None else None


def profile_name(value: str) -> str:
    """What a step records as its hardware profile (the lineage, metric labels): the profile's own name
    where ``value`` is its content or its file; else ``value`` itself (``local``: no profile)."""
    profile = read_profile(value)
    return profile.name if profile is not None else value


#: What a profile says of the pods' credentials: the pod has them already; a step's environment never names them.
CREDENTIAL_FIELDS = frozenset({"secrets_as_env", "image_pull_secrets"})


def to_env(profile: HardwareProfile) -> str:
    """What ``TRAINPIPE_HARDWARE_PROFILE`` carries onto a step: a built-in profile by its name, any other
    by its content as compact JSON, less the names of the secrets it mounts. A profile file exists on the
    machine that compiled the pipeline or parsed the DAG, not in the step's pod: its content travels instead."""
    if PROFILES.get(profile.name) == profile:
        return profile.name
    content = profile.model_dump(mode="json", exclude_defaults=True, exclude=set(CREDENTIAL_FIELDS))
    return json.dumps(content, sort_keys=True, separators=(",", ":"))


def get_profile(value: str) -> HardwareProfile:
    """A built-in profile by name, one loaded from a YAML (or JSON) file, or a profile's JSON itself
    (what :func:`to_env` carries onto a step).

    Raises:
        InputError: unknown name, or an invalid profile file or JSON.
    """
    if value in PROFILES:
        return PROFILES[value]
    if value.lstrip().startswith("{"):
        return build(HardwareProfile, parse_json(value, "profile"), where="profile")
    if value.endswith((".yaml", ".yml", ".json")):
        return build(HardwareProfile, load_file(value, "profile: hardware profile file"), where="profile")
    raise InputError(
        f"profile: unknown profile {value!r} (built in: {', '.join(PROFILES)}; or a YAML file, or a profile's JSON)"
    )
