"""Offline validation of generated Kubernetes manifests against published schemas.

- core objects (Pods): kubernetes-validate's strict JSON schemas;
- TrainJob: the Kubeflow Trainer's generated API models (kubeflow-trainer-api), with a
  round trip that catches any field the schema does not know;
- PyTorchJob: the Training Operator's generated models (kubeflow-training), walked by
  their ``openapi_types``, down into the Kubernetes client's models for pod templates.
"""

from __future__ import annotations

import re
from typing import Any

K8S_VERSION = "1.37.0"


def validate_pod(pod_spec: dict[str, Any], metadata: dict[str, Any] | None = None) -> None:
    import kubernetes_validate

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata or {"name": "check"}, "spec": pod_spec}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def validate_trainjob(manifest: dict[str, Any]) -> None:
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and manifest["kind"] == "TrainJob"
    obj = TrainerV1alpha1TrainJob.from_dict(manifest)
    back = _prune(obj.to_dict())
    assert back == manifest, "fields unknown to the TrainJob schema (dropped in the round trip)"
    # The pod the runtime will build: the patch applied to a container with the trainer's fields.
    trainer = manifest["spec"]["trainer"]
    for patch in manifest["spec"].get("runtimePatches", []):
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            pod = dict(job["template"]["spec"]["template"]["spec"])
            pod["containers"] = [
                {
                    **c,
                    "image": trainer["image"],
                    "command": trainer["command"],
                    "args": trainer["args"],
                    "resources": trainer["resourcesPerNode"],
                    "env": trainer.get("env", []),
                }
                for c in pod["containers"]
            ]
            validate_pod(pod)


def _check_openapi(value: Any, type_name: str, path: str) -> None:
    import kubernetes.client as k8s
    from kubeflow.training import models as kf

    if value is None:
        return
    m = re.fullmatch(r"list\[(.+)\]", type_name)
    if m:
        assert isinstance(value, list), f"{path}: expected a list"
        for i, item in enumerate(value):
            _check_openapi(item, m.group(1), f"{path}[{i}]")
        return
    m = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if m:
        assert isinstance(value, dict), f"{path}: expected a map"
        for key, item in value.items():
            _check_openapi(item, m.group(1), f"{path}.{key}")
        return
    scalars = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}
    if type_name in scalars:
        assert isinstance(value, scalars[type_name]), f"{path}: expected {type_name}, got {type(value).__name__}"
        return
    cls = getattr(kf, type_name, None) or getattr(k8s, type_name)
    assert isinstance(value, dict), f"{path}: expected an object ({type_name})"
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    unknown = set(value) - set(by_json)
    assert not unknown, f"{path}: fields unknown to {type_name}: {sorted(unknown)}"
    for key, item in value.items():
        _check_openapi(item, cls.openapi_types[by_json[key]], f"{path}.{key}")


def validate_pytorchjob(manifest: dict[str, Any]) -> None:
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "PyTorchJob"
    _check_openapi(manifest, "KubeflowOrgV1PyTorchJob", "PyTorchJob")
    for role, spec in manifest["spec"]["pytorchReplicaSpecs"].items():
        assert role in ("Master", "Worker")
        validate_pod(spec["template"]["spec"], {"name": "check", **spec["template"].get("metadata", {})})


#: Kueue v0.19.2's CRD schemas (config/components/crd/bases, Apache-2.0), their served versions'
#: openAPIV3Schema with the descriptions left out: see schemas/kueue/README.md.
KUEUE_SCHEMAS = __import__("pathlib").Path(__file__).resolve().parent / "schemas" / "kueue"


def _strict(schema: Any) -> Any:
    """A CRD schema as a strict JSON schema: an object that lists its properties allows no others
    (the API server would prune them silently: a typo would vanish, not fail)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        if schema.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def validate_kueue(obj: dict[str, Any]) -> None:
    """A Kueue object against its CRD's schema (offline), strictly."""
    import json

    import jsonschema

    group, _, version = obj["apiVersion"].partition("/")
    assert group == "kueue.x-k8s.io", obj["apiVersion"]
    doc = json.loads((KUEUE_SCHEMAS / f"{obj['kind']}.json").read_text())
    assert version in doc["versions"], f"{obj['kind']} has no served version {version}"
    schema = _strict(doc["versions"][version])
    schema["properties"]["metadata"] = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
            "namespace": {"type": "string"},
            "labels": {"type": "object"},
            "annotations": {"type": "object"},
        },
        "additionalProperties": False,
    }
    jsonschema.validate(obj, schema)
    assert ("namespace" in obj["metadata"]) == (doc["scope"] == "Namespaced"), f"{obj['kind']} is {doc['scope']}"


def validate_core(obj: dict[str, Any]) -> None:
    """A core Kubernetes object (Namespace, PriorityClass, …) against kubernetes-validate's strict schemas."""
    import kubernetes_validate

    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
