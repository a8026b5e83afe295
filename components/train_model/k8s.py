"""Multi-node training on Kubernetes through the Kubeflow Trainer.

When ``nnodes > 1`` and a ``cluster`` section is configured, the train_model step
(its KFP task or Airflow task) does not train itself: it stages the data on a shared
volume, submits a ``TrainJob`` (Kubeflow Trainer v2, the ``torch-distributed``
runtime) or a legacy ``PyTorchJob`` (kubeflow.org/v1) that runs the same image and
entrypoint on every node, waits for it, and copies node 0's model back as its own
output. Each node's entrypoint runs torchrun for its ranks, taking the node rank
and rendezvous address from the variables the operator sets (PET_NODE_RANK,
PET_MASTER_ADDR/PORT for the Trainer; RANK, MASTER_ADDR/PORT for PyTorchJob).
Single-node training keeps running inside the step's own pod.

The job's name is derived from the orchestrator's run id and the step's output, so a retried
step finds the job its earlier attempt started and waits for it instead of starting a second
one (a failed one is deleted and started again). The job is deleted when the wait times out and
when the step is killed. Its pods get the hardware profile through :mod:`trainpipe.services.pods`, the
translation every pod trainpipe creates gets (resources, ``nvidia.com/gpu`` or a MIG resource,
node selector and affinity, tolerations, service account, image pull secrets, secrets as
environment variables, the restricted security contexts), plus the platform policy. The
Kubernetes client is imported only to submit.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainpipe.components.train_model.node_result import adopt
from trainpipe.components.train_model.spec import ClusterJob, TrainModelConfig, TrainModelResult
from trainpipe.contract.errors import Cancelled, InputError, ServiceUnavailable, TrainpipeError
from trainpipe.contract.io import atomic_write_json, atomic_write_settings
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.policy import Policy
from trainpipe.contract.runtime import PROFILE_ENV, Runtime
from trainpipe.data.tabular import find_dataset
from trainpipe.services import pods
from trainpipe.services.profiles import HardwareProfile, get_profile
from trainpipe.services.profiles import to_env as profile_env

TRAINER_GROUP, TRAINER_VERSION, TRAINER_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
VOLUME = "trainpipe-shared"
MANAGER = "trainpipe.io/train-model"
LABELS = {"app.kubernetes.io/managed-by": "trainpipe", "app.kubernetes.io/component": "train_model"}


def job_name(run_id: str, output_dir: str, prefix: str = "trainpipe-train") -> str:
    """A DNS-1035 name, the same for every attempt of one step of one run (its run id and output)."""
    digest = hashlib.sha256(f"{run_id}|{Path(output_dir).resolve()}".encode()).hexdigest()[:12]
    return f"{prefix}-{digest}"


def _job_env(policy: Policy | None, profile: HardwareProfile | None = None) -> dict[str, str]:
    """What every node gets besides the profile's secrets: the platform policy the step runs under, and the
    job's hardware profile itself (node 0 reports the training's cost at its prices)."""
    from trainpipe.contract.policy import ENV, to_env

    rules = to_env(policy) if policy is not None else "{}"
    env = {ENV: rules} if rules != "{}" else {}
    return {**env, PROFILE_ENV: profile_env(profile)} if profile is not None else env


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        raise InputError(f"cluster.job_name: {name!r} is not a valid Kubernetes name (lowercase letters, digits, '-')")


def node_command(node_config: str, result_path: str) -> tuple[list[str], list[str]]:
    """What every node runs: the component's own entrypoint."""
    return ["python", "-m", "trainpipe.components.train_model"], ["--config", node_config, "--result", result_path]


def _pod_metadata(metrics_port: int, name: str) -> dict[str, Any]:
    labels, annotations = pods.metrics_metadata(metrics_port)
    meta: dict[str, Any] = {"labels": {**LABELS, pods.JOB_LABEL: name, **labels}}
    if annotations:
        meta["annotations"] = annotations
    return meta


def namespace(cluster: ClusterJob, profile: HardwareProfile) -> str:
    """Where the job goes: the cluster setting, else the profile's team namespace, else kubeflow."""
    return cluster.namespace or profile.namespace or "kubeflow"


def _job_metadata(name: str, cluster: ClusterJob, profile: HardwareProfile) -> dict[str, Any]:
    """The job object's metadata: Kueue admits the whole job (all its nodes at once) from the
    queue its labels name, against the team's quota."""
    return {"name": name, "namespace": namespace(cluster, profile), "labels": {**LABELS, **pods.queue_labels(profile)}}


def _node_spec(profile: HardwareProfile, name: str, **kwargs: Any) -> dict[str, Any]:
    """A node's pod spec, with the anti-affinity that spreads the job's nodes over machines."""
    spec = pods.pod_spec(profile, profile.train, training=True, **kwargs)
    spread = pods.rank_anti_affinity(profile, name)
    if spread:
        spec.setdefault("affinity", {})["podAntiAffinity"] = spread
    return spec


@dataclass(frozen=True)
class NodeJob:
    """What a multi-node job is made of, whichever operator runs it: one parameter object for both manifests."""

    name: str
    cluster: ClusterJob
    nnodes: int
    nproc_per_node: int
    #: the settings every node reads, and where node 0 writes its result (both on the shared volume)
    node_config: str
    result_path: str
    profile: HardwareProfile
    image: str
    #: restarts of the whole job (a PyTorchJob's backoffLimit; a TrainJob's runtime owns its own)
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0

    def node_spec(self, container_name: str, in_pod: bool) -> tuple[list[str], list[str], dict[str, Any]]:
        """The node's command, its arguments, and its pod spec with the job's volume and spread; ``in_pod``: the
        container carries the image, command and environment itself (a TrainJob's trainer section sets them)."""
        _check_name(self.name)
        command, args = node_command(self.node_config, self.result_path)
        inline = (
            {"image": self.image, "command": command, "args": args, "env": {"TRAINPIPE_JOB_ID": self.name, **self.env}}
            if in_pod
            else {}
        )
        pvcs = {self.cluster.shared_pvc: self.cluster.mount_path}
        spec = _node_spec(self.profile, self.name, container_name=container_name, pvcs=pvcs, **inline)
        return command, args, spec


def trainjob_manifest(job: NodeJob) -> dict[str, Any]:
    """A Kubeflow Trainer ``TrainJob`` on the ``torch-distributed`` runtime (or ``cluster.runtime``)."""
    name, cluster, profile = job.name, job.cluster, job.profile
    command, args, template = job.node_spec("node", in_pod=False)
    # a TrainJob's pod patch has no priorityClassName: its priority is Kueue's WorkloadPriorityClass (the job's label)
    template.pop("priorityClassName", None)
    container = template["containers"][0]
    # the trainer section sets image, command, resources and env; the patch gives the pod the rest
    container.pop("resources", None)
    container["env"] = [e for e in container["env"] if "valueFrom" in e]
    if not container["env"]:
        container.pop("env")
    trainer_env = [{"name": "TRAINPIPE_JOB_ID", "value": name}] + [
        {"name": k, "value": v} for k, v in sorted(job.env.items())
    ]
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": _job_metadata(name, cluster, profile),
        "spec": {
            "runtimeRef": {"name": cluster.runtime},
            "trainer": {
                "image": job.image,
                "command": command,
                "args": args,
                "numNodes": job.nnodes,
                "numProcPerNode": job.nproc_per_node,
                "resourcesPerNode": profile.train.as_k8s(),
                "env": trainer_env,
            },
            "runtimePatches": [
                {
                    "manager": MANAGER,
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {
                                                "template": {
                                                    "metadata": _pod_metadata(job.metrics_port, name),
                                                    "spec": template,
                                                }
                                            }
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def pytorchjob_manifest(job: NodeJob) -> dict[str, Any]:
    """A legacy Training Operator ``PyTorchJob`` (kubeflow.org/v1): one Master and ``nnodes - 1`` Workers."""
    name, nnodes = job.name, job.nnodes
    _, _, spec = job.node_spec("pytorch", in_pod=True)  # the container name the operator expects
    template = {"metadata": _pod_metadata(job.metrics_port, name), "spec": spec}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if nnodes > 1:
        replicas["Worker"] = {"replicas": nnodes - 1, "restartPolicy": "OnFailure", "template": template}
    return {
        "apiVersion": f"{PYTORCHJOB_GROUP}/{PYTORCHJOB_VERSION}",
        "kind": "PyTorchJob",
        "metadata": _job_metadata(name, job.cluster, job.profile),
        "spec": {
            "nprocPerNode": str(job.nproc_per_node),
            "runPolicy": {"backoffLimit": job.max_restarts, "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replicas,
        },
    }


def stage(config: TrainModelConfig, name: str) -> tuple[Path, TrainModelConfig]:
    """Copy the data to the shared volume and write the config every node reads."""
    cluster = config.cluster
    assert cluster is not None
    workdir = Path(cluster.mount_path) / name
    data = find_dataset(config.data, "data")
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    if data.is_dir():
        shutil.copytree(data, workdir / "data" / data.name, dirs_exist_ok=True)
    else:
        shutil.copy2(data, workdir / "data" / data.name)
    node = config.model_copy(
        update={
            "data": str(workdir / "data" / data.name),
            "output_dir": str(workdir / "model"),
            "checkpoint_dir": None,
            "cluster": None,
            "node_rank": None,
            "metrics_port": config.metrics_port
            if config.metrics_port is not None
            else get_profile(cluster.profile).metrics_port,
        }
    )
    atomic_write_settings(workdir / "train.json", node, exclude={"cluster"})
    return workdir, node


def manifest_for(config: TrainModelConfig, name: str, workdir: Path, policy: Policy | None = None) -> dict[str, Any]:
    cluster = config.cluster
    assert cluster is not None
    profile = get_profile(cluster.profile)
    image = cluster.image or os.environ.get("TRAINPIPE_IMAGE", "")
    if not image:
        raise InputError("cluster.image: set it (or TRAINPIPE_IMAGE) to the trainpipe image the nodes run")
    port = config.metrics_port if config.metrics_port is not None else profile.metrics_port
    job = NodeJob(
        name,
        cluster,
        config.nnodes,
        config.nproc_per_node,
        str(workdir / "train.json"),
        str(workdir / "result.json"),
        profile,
        image,
        max_restarts=config.max_restarts,
        env=_job_env(policy, profile),
        metrics_port=port,
    )
    return pytorchjob_manifest(job) if cluster.launcher == "pytorchjob" else trainjob_manifest(job)


def _api() -> Any:
    try:
        from kubernetes import client
        from kubernetes import config as kconfig
    except ImportError:
        raise InputError(
            "cluster: submitting a training job needs the kubernetes client (pip install 'trainpipe[kfp]')"
        ) from None
    try:
        kconfig.load_incluster_config()
    except kconfig.ConfigException:
        try:
            kconfig.load_kube_config()
        except Exception as exc:
            raise ServiceUnavailable(f"cluster: no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from None
    return client.CustomObjectsApi()


def _coords(kind: str) -> tuple[str, str, str]:
    if kind == "TrainJob":
        return TRAINER_GROUP, TRAINER_VERSION, TRAINER_PLURAL
    return PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL


def job_state(obj: dict[str, Any]) -> str | None:
    """``Succeeded``/``Failed`` from a TrainJob's or PyTorchJob's conditions, or None while running."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") in ("Complete", "Succeeded"):
            return "Succeeded"
        if cond.get("type") == "Failed":
            return "Failed"
    return None


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


def delete_job(api: Any, manifest: dict[str, Any]) -> None:
    """Delete the job and its pods (foreground); a job already gone is fine."""
    group, version, plural = _coords(manifest["kind"])
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    try:
        api.delete_namespaced_custom_object(group, version, ns, plural, name, body={"propagationPolicy": "Foreground"})
    except Exception as exc:
        if _status(exc) != 404:
            raise ServiceUnavailable(
                f"cluster: deleting {manifest['kind']} {ns}/{name} failed: {str(exc).splitlines()[0]}"
            ) from None


def submit_and_wait(manifest: dict[str, Any], poll_s: float, timeout_s: float, api: Any | None = None) -> None:
    """Create the job, or reattach to the one an earlier attempt of this step created, and wait until it succeeds.

    An earlier attempt's job that failed is deleted and created again. The job is deleted when the
    wait times out and when this process is told to stop (SIGTERM: a killed task).

    Raises:
        TrainpipeError: the job failed.
        ServiceUnavailable: the API server cannot be reached, or the wait timed out.
    """
    api = api or _api()
    group, version, plural = _coords(manifest["kind"])
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    what = f"{manifest['kind']} {ns}/{name}"

    def read() -> dict[str, Any] | None:
        try:
            return api.get_namespaced_custom_object(group, version, ns, plural, name)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise ServiceUnavailable(f"cluster: reading {what} failed: {str(exc).splitlines()[0]}") from None

    existing = read()
    if existing is not None and job_state(existing) == "Failed":
        print(f"train_model: {what} from an earlier attempt failed; deleting it and starting again", flush=True)
        delete_job(api, manifest)
        deadline = time.monotonic() + 300
        while read() is not None and time.monotonic() < deadline:
            time.sleep(poll_s)
        existing = None
    if existing is None:
        try:
            api.create_namespaced_custom_object(group, version, ns, plural, manifest)
        except Exception as exc:
            if _status(exc) != 409:  # 409: created meanwhile by another attempt: wait for it
                raise ServiceUnavailable(f"cluster: creating {what} failed: {str(exc).splitlines()[0]}") from None
    else:
        print(f"train_model: reattaching to {what}, which an earlier attempt of this step started", flush=True)

    def stop(signum: int, _frame: Any) -> None:
        delete_job(api, manifest)
        raise SystemExit(128 + signum)

    import threading

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if main else None
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            obj = read()
            if obj is None:
                raise Cancelled(f"cluster: {what} was deleted outside trainpipe (kubectl delete); not retried")
            state = job_state(obj)
            if state == "Succeeded":
                return
            if state == "Failed":
                raise TrainpipeError(f"cluster: {what} failed (kubectl -n {ns} describe {plural} {name})")
            time.sleep(poll_s)
        delete_job(api, manifest)
        raise ServiceUnavailable(f"cluster: {what} did not finish within {timeout_s:.0f} s; deleted it")
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def run_cluster_job(
    config: TrainModelConfig, lineage: Lineage, runtime: Runtime, api: Any | None = None
) -> TrainModelResult:
    """Stage, submit, wait, and bring node 0's model back into ``output_dir``; the nodes run under
    ``runtime``'s policy."""
    cluster = config.cluster
    assert cluster is not None
    name = cluster.job_name or job_name(lineage.orchestrator.run_id if lineage.orchestrator else "", config.output_dir)
    workdir, _ = stage(config, name)
    manifest = manifest_for(config, name, workdir, runtime.policy)
    atomic_write_json(workdir / "manifest.json", manifest)
    submit_and_wait(manifest, cluster.poll_s, cluster.timeout_s, api)
    job = f"{manifest['kind']}/{manifest['metadata']['namespace']}/{name}"
    return adopt(workdir / "result.json", workdir / "model", config.output_dir, lineage, job)
