"""The parameter surface every face shares, in one place.

A setting's name, type, default and bounds are written once: in the component's spec
(``<Name>Params``). The KFP face takes every one of them under the same name and default, the
Airflow face passes them through as the same flags, and the pipeline and the DAG take them from the
pipeline config, whose ``train`` section is derived from train_model's spec. What differs is
mapped here and checked by a contract test:

- artifacts: a spec names a path field (``data``, ``output_dir``); a KFP face names the artifact by
  what it holds (``ARTIFACTS``).
- unset: KFP parameters cannot be None (kfp.local rejects it), so a spec default of None is the
  type's empty value on a KFP face (``UNSET``), and :func:`from_face` turns it back into None.
- face-only parameters (``FACE_ONLY``): the orchestrator's run id, and the snapshot's md5 that puts
  the content hash into a KFP task's cache key.
- renamed settings (``RENAMED``): a step's setting the pipeline names otherwise (the DVC repo and
  remote; the alias the gate compares with is the alias register_model moves).

Stdlib only at import (the KFP component bodies import it inside the container).
"""

from __future__ import annotations

import importlib
from typing import Any

#: spec field -> the artifact's name on the KFP face.
ARTIFACTS: dict[str, dict[str, str]] = {
    "validate_data": {"data": "data", "output_dir": "validated"},
    "snapshot_dataset": {"data": "data", "output_dir": "snapshot"},
    "train_model": {"data": "data", "output_dir": "model"},
    "profile_training": {"model": "model", "data": "data", "output_dir": "profile"},
    "evaluate_model": {"model": "model", "data": "data", "output_dir": "decision"},
    "register_model": {
        "model": "model",
        "decision": "decision",
        "profile": "profile",
        "optimized": "optimized",
        "output_dir": "registration",
    },
    "detect_drift": {"data": "data", "reference": "reference", "output_dir": "drift"},
    "optimize_model": {
        "model": "model",
        "data": "data",
        "calibration_data": "calibration_data",
        "output_dir": "optimized",
    },
}
#: A step's setting that the pipeline (and the DAG) names otherwise: (component, its field) -> the
#: pipeline's setting. Every other step setting that shares a pipeline setting's name takes it.
RENAMED: dict[tuple[str, str], str] = {
    ("snapshot_dataset", "repo_dir"): "dvc_repo_dir",
    ("snapshot_dataset", "remote_url"): "dvc_remote_url",
    (
        "evaluate_model",
        "champion_alias",
    ): "alias",  # the gate compares with the model serving under the pipeline's alias
    ("detect_drift", "champion_alias"): "alias",  # drift is measured against the data of the model serving under it
}
#: A step's setting that shares a pipeline setting's name but is not that setting: it keeps its own value.
NOT_FROM_PIPELINE: dict[tuple[str, str], str] = {
    (
        "profile_training",
        "profile_steps",
    ): "the steps a profiling pass of its own traces; in a pipeline it reads the trace train_model made",
}
#: Parameters of a face that are not settings of the component.
FACE_ONLY = frozenset({"run_id", "dataset_md5"})
#: What stands for "unset" (a spec default of None) on a KFP face, by the parameter's type.
UNSET: dict[type, Any] = {int: 0, float: 0.0, str: "", dict: {}, list: []}


def params_model(component: str) -> Any:
    """The component's settings model (``<Name>Params`` in its spec)."""
    spec = importlib.import_module(f"trainpipe.components.{component}.spec")
    return getattr(spec, "".join(p.title() for p in component.split("_")) + "Params")


def from_face(component: str, values: dict[str, Any]) -> dict[str, Any]:
    """A face's parameter values as the component's settings: the unset stand-ins become None
    where the spec's default is None; face-only parameters are dropped."""
    fields = params_model(component).model_fields
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in FACE_ONLY:
            continue
        field = fields.get(name)
        if (
            field is not None
            and not field.is_required()
            and field.get_default(call_default_factory=True) is None
            and value == UNSET.get(type(value), object())
        ):
            value = None
        out[name] = value
    return out
