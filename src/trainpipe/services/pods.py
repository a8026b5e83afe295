"""One translation of a hardware profile into a Kubernetes pod, for every pod trainpipe creates.

An Airflow task in Kubernetes mode, a TrainJob's nodes and a PyTorchJob's replicas all get their
scheduling (node selector, tolerations, node affinity), identity (service account, image pull
secrets), secrets (as environment variables, by name: Kubernetes injects the values), resources and
the Pod Security "restricted" contexts from here, as core/v1 JSON. Stdlib only.
"""

from __future__ import annotations

from typing import Any

from trainpipe.services.images import RUN_AS

#: The label the shipped PodMonitor selects (monitoring/podmonitor.yaml): a pod whose ranks serve metrics.
METRICS_LABEL = "trainpipe.io/metrics"
#: The main container of each kind of pod trainpipe's training runs in (KFP, Airflow's
#: KubernetesPodOperator, a TrainJob node, a PyTorchJob replica): the one the PodMonitor scrapes.
MAIN_CONTAINERS = ("main", "base", "node", "pytorch")


#: Kueue's labels: the LocalQueue a workload is submitted to, and its WorkloadPriorityClass.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: The label that names the multi-node training job a pod belongs to (what rank anti-affinity selects).
JOB_LABEL = "trainpipe.io/job"


def queue_labels(profile: Any) -> dict[str, str]:
    """The Kueue labels of a workload under ``profile``: its LocalQueue and, with one, its
    WorkloadPriorityClass (none without a queue: Kueue does not manage the workload then)."""
    if not getattr(profile, "kueue_queue", None):
        return {}
    labels = {QUEUE_LABEL: profile.kueue_queue}
    if profile.priority_class:
        labels[PRIORITY_LABEL] = profile.priority_class
    return labels


def rank_anti_affinity(profile: Any, job: str) -> dict[str, Any] | None:
    """Pod anti-affinity that spreads the pods of one multi-node job (labelled ``trainpipe.io/job``)
    over machines: ``required`` (one per machine) or ``preferred``, per the profile's rank_spread."""
    term = {"labelSelector": {"matchLabels": {JOB_LABEL: job}}, "topologyKey": "kubernetes.io/hostname"}
    if profile.rank_spread == "required":
        return {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    if profile.rank_spread == "preferred":
        return {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}
    return None


def metrics_metadata(base: int) -> tuple[dict[str, str], dict[str, str]]:
    """``(labels, annotations)`` of a training pod whose ranks serve metrics from port ``base``: the
    label the PodMonitor selects, and the ``prometheus.io`` annotations it (or a Prometheus that
    discovers pods by annotation) reads the port from. Local rank 0's endpoint answers for every
    rank of its pod, so one target per pod covers them all, and no container port needs declaring
    (a TrainJob's patch and a KFP task cannot declare one)."""
    if not base:
        return {}, {}
    return {METRICS_LABEL: "true"}, {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(base),
        "prometheus.io/path": "/metrics",
    }


def pod_security() -> dict[str, Any]:
    """Pod Security Standard "restricted", pod part: non-root as trainpipe's user, RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    """Pod Security Standard "restricted", container part."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def secret_env(profile: Any) -> list[dict[str, Any]]:
    """The profile's secrets as environment variables (names only; Kubernetes injects the values)."""
    return [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for secret, keys in sorted(profile.secrets_as_env.items())
        for key, env in sorted(keys.items())
    ]


def scheduling(profile: Any) -> dict[str, Any]:
    """The pod-level fields: scheduling, identity, security context."""
    spec: dict[str, Any] = {"securityContext": pod_security()}
    if profile.node_selector:
        spec["nodeSelector"] = dict(profile.node_selector)
    if profile.tolerations:
        spec["tolerations"] = [t.as_k8s() for t in profile.tolerations]
    if profile.node_affinity:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [dict(e) for e in profile.node_affinity]}]
                }
            }
        }
    if profile.service_account:
        spec["serviceAccountName"] = profile.service_account
    if getattr(profile, "priority_class", None):
        spec["priorityClassName"] = profile.priority_class
    if profile.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in profile.image_pull_secrets]
    return spec


def container(
    profile: Any,
    resources: Any,
    *,
    name: str,
    image: str | None = None,
    command: list[str] | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    mounts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The main container: resources, the profile's secrets and ``env``, the restricted context,
    ``mounts`` (volume -> path)."""
    c: dict[str, Any] = {
        "name": name,
        "securityContext": container_security(),
        "resources": resources.as_k8s(),
        "env": [{"name": k, "value": v} for k, v in sorted((env or {}).items())] + secret_env(profile),
    }
    if image:
        c["image"] = image
        c["imagePullPolicy"] = profile.image_pull_policy
    if command:
        c["command"] = list(command)
    if args:
        c["args"] = list(args)
    if mounts:
        c["volumeMounts"] = [{"name": v, "mountPath": p} for v, p in sorted(mounts.items())]
    return c


def pod_spec(
    profile: Any,
    resources: Any,
    *,
    container_name: str,
    image: str | None = None,
    command: list[str] | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    pvcs: dict[str, str] | None = None,
    training: bool = False,
) -> dict[str, Any]:
    """A whole core/v1 PodSpec: :func:`scheduling`, one :func:`container`, and ``pvcs`` (claim ->
    mount path) as volumes.
    A training pod (``training``) gets the profile's termination grace: after SIGTERM its ranks
    finish their step and write a checkpoint before the kubelet kills them."""
    volumes = {f"pvc-{i}": (claim, path) for i, (claim, path) in enumerate(sorted((pvcs or {}).items()))}
    spec = scheduling(profile)
    if training:
        spec["terminationGracePeriodSeconds"] = profile.termination_grace_s
    spec["containers"] = [
        container(
            profile,
            resources,
            name=container_name,
            image=image,
            command=command,
            args=args,
            env=env,
            mounts={v: path for v, (_, path) in volumes.items()},
        )
    ]
    if volumes:
        spec["volumes"] = [
            {"name": v, "persistentVolumeClaim": {"claimName": claim}} for v, (claim, _) in volumes.items()
        ]
    return spec
