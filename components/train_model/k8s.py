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

The manifests carry the hardware profile (resources, ``nvidia.com/gpu`` or a MIG
resource, node selector, tolerations, service account) and a restricted pod
security context. The Kubernetes client is imported only to submit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from trainpipe.components.train_model.spec import ClusterJob, TrainModelConfig, TrainModelResult
from trainpipe.contract.errors import InputError, ServiceUnavailable, TrainpipeError
from trainpipe.contract.io import atomic_write_json
from trainpipe.profiles import HardwareProfile, get_profile
from trainpipe.tabular import find_data_file

TRAINER_GROUP, TRAINER_VERSION, TRAINER_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
VOLUME = "trainpipe-shared"
MANAGER = "trainpipe.io/train-model"
LABELS = {"app.kubernetes.io/managed-by": "trainpipe", "app.kubernetes.io/component": "train_model"}


def container_security() -> dict[str, Any]:
    """Pod Security Standard "restricted", container part."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}


def _pod_scheduling(profile: HardwareProfile) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if profile.node_selector:
        spec["nodeSelector"] = dict(profile.node_selector)
    if profile.tolerations:
        spec["tolerations"] = [t.as_k8s() for t in profile.tolerations]
    if profile.service_account:
        spec["serviceAccountName"] = profile.service_account
    return spec


def job_name(prefix: str = "trainpipe-train") -> str:
    """A DNS-1035 name, unique per submission."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        raise InputError(f"cluster.job_name: {name!r} is not a valid Kubernetes name (lowercase letters, digits, '-')")


def node_command(node_config: str, result_path: str) -> tuple[list[str], list[str]]:
    """What every node runs: the component's own entrypoint."""
    return ["python", "-m", "trainpipe.components.train_model"], ["--config", node_config, "--result", result_path]


def trainjob_manifest(
    name: str, cluster: ClusterJob, nnodes: int, nproc_per_node: int, node_config: str, result_path: str, profile: HardwareProfile, image: str,
) -> dict[str, Any]:
    """A Kubeflow Trainer ``TrainJob`` on the ``torch-distributed`` runtime (or ``cluster.runtime``)."""
    _check_name(name)
    command, args = node_command(node_config, result_path)
    pod_spec: dict[str, Any] = {
        **_pod_scheduling(profile),
        "securityContext": pod_security(),
        "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": cluster.shared_pvc}}],
        "containers": [
            {
                "name": "node",
                "securityContext": container_security(),
                "volumeMounts": [{"name": VOLUME, "mountPath": cluster.mount_path}],
            }
        ],
    }
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": cluster.namespace, "labels": dict(LABELS)},
        "spec": {
            "runtimeRef": {"name": cluster.runtime},
            "trainer": {
                "image": image,
                "command": command,
                "args": args,
                "numNodes": nnodes,
                "numProcPerNode": nproc_per_node,
                "resourcesPerNode": profile.train.as_k8s(),
                "env": [{"name": "TRAINPIPE_JOB_ID", "value": name}],
            },
            "runtimePatches": [
                {
                    "manager": MANAGER,
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def pytorchjob_manifest(
    name: str, cluster: ClusterJob, nnodes: int, nproc_per_node: int, node_config: str, result_path: str,
    profile: HardwareProfile, image: str, max_restarts: int,
) -> dict[str, Any]:
    """A legacy Training Operator ``PyTorchJob`` (kubeflow.org/v1): one Master and ``nnodes - 1`` Workers."""
    _check_name(name)
    command, args = node_command(node_config, result_path)
    template = {
        "metadata": {"labels": dict(LABELS)},
        "spec": {
            **_pod_scheduling(profile),
            "securityContext": pod_security(),
            "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": cluster.shared_pvc}}],
            "containers": [
                {
                    "name": "pytorch",  # the name the operator expects
                    "image": image,
                    "command": command,
                    "args": args,
                    "env": [{"name": "TRAINPIPE_JOB_ID", "value": name}],
                    "resources": profile.train.as_k8s(),
                    "securityContext": container_security(),
                    "volumeMounts": [{"name": VOLUME, "mountPath": cluster.mount_path}],
                }
            ],
        },
    }
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if nnodes > 1:
        replicas["Worker"] = {"replicas": nnodes - 1, "restartPolicy": "OnFailure", "template": template}
    return {
        "apiVersion": f"{PYTORCHJOB_GROUP}/{PYTORCHJOB_VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": cluster.namespace, "labels": dict(LABELS)},
        "spec": {
            "nprocPerNode": str(nproc_per_node),
            "runPolicy": {"backoffLimit": max_restarts, "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replicas,
        },
    }


def stage(config: TrainModelConfig, name: str) -> tuple[Path, TrainModelConfig]:
    """Copy the data to the shared volume and write the config every node reads."""
    cluster = config.cluster
    assert cluster is not None
    workdir = Path(cluster.mount_path) / name
    data = find_data_file(config.data, "data")
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    shutil.copy2(data, workdir / "data" / data.name)
    node = config.model_copy(
        update={
            "data": str(workdir / "data" / data.name),
            "output_dir": str(workdir / "model"),
            "checkpoint_dir": None,
            "cluster": None,
            "node_rank": None,
        }
    )
    atomic_write_json(workdir / "train.json", node.model_dump(mode="json", exclude={"cluster"}))
    return workdir, node


def manifest_for(config: TrainModelConfig, name: str, workdir: Path) -> dict[str, Any]:
    cluster = config.cluster
    assert cluster is not None
    profile = get_profile(cluster.profile)
    image = cluster.image or os.environ.get("TRAINPIPE_IMAGE", "")
    if not image:
        raise InputError("cluster.image: set it (or TRAINPIPE_IMAGE) to the trainpipe image the nodes run")
    args = (name, cluster, config.nnodes, config.nproc_per_node, str(workdir / "train.json"), str(workdir / "result.json"), profile, image)
    if cluster.launcher == "pytorchjob":
        return pytorchjob_manifest(*args, max_restarts=config.max_restarts)
    return trainjob_manifest(*args)


def _api() -> Any:
    try:
        from kubernetes import client, config as kconfig
    except ImportError:
        raise InputError("cluster: submitting a training job needs the kubernetes client (pip install 'trainpipe[kfp]')") from None
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


def submit_and_wait(manifest: dict[str, Any], poll_s: float, timeout_s: float, api: Any | None = None) -> None:
    """Create the job and wait until it succeeds.

    Raises:
        TrainpipeError: the job failed.
        ServiceUnavailable: the API server cannot be reached, or the wait timed out.
    """
    api = api or _api()
    group, version, plural = _coords(manifest["kind"])
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    try:
        api.create_namespaced_custom_object(group, version, ns, plural, manifest)
    except Exception as exc:
        raise ServiceUnavailable(f"cluster: creating {manifest['kind']} {ns}/{name} failed: {str(exc).splitlines()[0]}") from None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            obj = api.get_namespaced_custom_object(group, version, ns, plural, name)
        except Exception as exc:
            raise ServiceUnavailable(f"cluster: reading {manifest['kind']} {ns}/{name} failed: {str(exc).splitlines()[0]}") from None
        state = job_state(obj)
        if state == "Succeeded":
            return
        if state == "Failed":
            raise TrainpipeError(f"cluster: {manifest['kind']} {ns}/{name} failed (kubectl -n {ns} describe {plural} {name})")
        time.sleep(poll_s)
    raise ServiceUnavailable(f"cluster: {manifest['kind']} {ns}/{name} did not finish within {timeout_s:.0f} s")


def run_cluster_job(config: TrainModelConfig, lineage: dict[str, Any], api: Any | None = None) -> TrainModelResult:
    """Stage, submit, wait, and bring node 0's model back into ``output_dir``."""
    cluster = config.cluster
    assert cluster is not None
    name = cluster.job_name or job_name()
    workdir, _ = stage(config, name)
    manifest = manifest_for(config, name, workdir)
    atomic_write_json(workdir / "manifest.json", manifest)
    submit_and_wait(manifest, cluster.poll_s, cluster.timeout_s, api)
    result_file = workdir / "result.json"
    if not result_file.is_file():
        raise TrainpipeError(f"cluster: the job finished but node 0 wrote no result at {result_file}")
    payload = json.loads(result_file.read_text(encoding="utf-8"))
    out = Path(config.output_dir)
    for item in (workdir / "model").iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copy2(item, out / item.name)
        elif item.is_dir() and item.name == "telemetry":
            shutil.copytree(item, out / item.name, dirs_exist_ok=True)
    node_lineage = payload.pop("lineage", {}) or {}
    merged = dict(lineage)
    merged["training"] = {**node_lineage.get("training", {}), "cluster_job": f"{manifest['kind']}/{cluster.namespace}/{name}"}
    result = TrainModelResult.model_validate(payload)
    result.lineage = merged
    return result
