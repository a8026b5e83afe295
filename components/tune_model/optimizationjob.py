"""The same search as a Kubeflow Trainer ``OptimizationJob`` (the Optuna-backed successor of Katib's
Experiment): objectives, the Optuna algorithm and seed, the search space (Katib's parameter shapes:
``parameterType``, ``feasibleSpace``), how many trials and how many at once, and each trial as a
``TrainJob`` that runs train_model with the trial's values substituted into its arguments
(``${trialParameters.<name>}``). ``trainpipe tune --emit optimizationjob`` writes it; nothing is submitted.

What is validated offline: the trial's TrainJob against the Trainer's published API models
(kubeflow-trainer-api), and the metadata against Kubernetes' naming rules. kubeflow-trainer-api 2.3.0
publishes no OptimizationJob model, so the outer fields follow the Trainer's proposal unvalidated.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trainpipe.components.tune_model.spec import Param, TuneModelParams
from trainpipe.contract.errors import InputError

API_VERSION = "trainer.kubeflow.org/v1alpha1"


def _k8s_name(value: str) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", value.lower()).strip("-")[:63].strip("-")
    return name or "trainpipe-tune"


def _placeholder(name: str) -> str:
    return "${trialParameters." + re.sub(r"[^A-Za-z0-9]", "_", name) + "}"


def _parameter(name: str, p: Param) -> dict[str, Any]:
    key = re.sub(r"[^A-Za-z0-9]", "_", name)
    if p.type == "categorical":
        assert p.choices is not None
        return {
            "name": key,
            "parameterType": "categorical",
            "feasibleSpace": {"list": [json.dumps(c) if not isinstance(c, str) else c for c in p.choices]},
        }
    space: dict[str, Any] = {"min": str(p.low), "max": str(p.high)}
    if p.type == "int":
        space = {"min": str(int(p.low or 0)), "max": str(int(p.high or 0))}
    if p.step:
        space["step"] = str(p.step)
    if p.log:
        space["distribution"] = "logUniform"
    return {"name": key, "parameterType": "double" if p.type == "float" else "int", "feasibleSpace": space}


def trainer_args(params: TuneModelParams, data: str, output_root: str) -> list[str]:
    """train_model's flags for one trial: ``train``, then each parameter as its placeholder."""
    flags: dict[str, Any] = {k: v for k, v in params.train.items() if k != "train_config"}
    train_config: dict[str, Any] = dict(params.train.get("train_config") or {})
    for name in params.space:
        if name.startswith("train_config."):
            train_config[name.removeprefix("train_config.")] = _placeholder(name)
        else:
            flags[name] = _placeholder(name)
    args = ["--data", data, "--output-dir", f"{output_root}/${{trialParameters.trialName}}"]
    args += ["--test-fraction", str(params.validation_fraction), "--seed", str(params.seed)]
    args += ["--label-column", params.label_column, "--experiment-name", params.experiment_name]
    for key, value in flags.items():
        args += ["--" + key.replace("_", "-"), value if isinstance(value, str) else json.dumps(value)]
    if train_config:  # the placeholders are substituted as text: numbers stay numbers in the JSON
        text = json.dumps(train_config)
        for name in params.space:
            text = text.replace(json.dumps(_placeholder(name)), _placeholder(name))
        args += ["--train-config", text]
    return args


def manifest(
    params: TuneModelParams,
    *,
    name: str,
    namespace: str,
    image: str,
    data: str,
    output_root: str,
    workers: int,
    resources: dict[str, Any],
) -> dict[str, Any]:
    """The OptimizationJob of this search.

    Raises:
        InputError: a conditional parameter (an OptimizationJob has none) or several objectives with pruning.
    """
    for pname, p in params.space.items():
        if p.when:
            raise InputError(f"space.{pname}.when: an OptimizationJob has no conditional parameters")
    job = _k8s_name(name)
    trial_params = [
        {"name": re.sub(r"[^A-Za-z0-9]", "_", n), "reference": re.sub(r"[^A-Za-z0-9]", "_", n)} for n in params.space
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "OptimizationJob",
        "metadata": {
            "name": job,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "trainpipe", "app.kubernetes.io/component": "tune_model"},
        },
        "spec": {
            "objectives": [{"metric": o.metric, "direction": o.resolved()} for o in params.objectives],
            "algorithm": {
                "name": "optuna",
                "settings": [
                    {"name": "sampler", "value": "TPESampler"},
                    {"name": "seed", "value": str(params.sampler_seed)},
                    {"name": "pruner", "value": "MedianPruner" if params.pruner == "median" else "NopPruner"},
                ],
            },
            "searchSpace": [_parameter(n, p) for n, p in params.space.items()],
            "trialConfig": {
                "numTrials": params.n_trials,
                "parallelTrials": workers,
                "maxFailedTrials": max(1, params.retry_failed * workers),
            },
            "trialTemplate": {
                "trialParameters": trial_params,
                "trainJob": {
                    "runtimeRef": {"name": "torch-distributed"},
                    "trainer": {
                        "image": image,
                        "command": ["python", "-m", "trainpipe.components.train_model"],
                        "args": trainer_args(params, data, output_root),
                        "numNodes": int(params.train.get("nnodes", 1)),
                        "numProcPerNode": int(params.train.get("nproc_per_node", 2)),
                        "resourcesPerNode": resources,
                    },
                },
            },
        },
    }
