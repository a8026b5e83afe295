"""`trainpipe tune --emit optimizationjob`: the search as a Kubeflow Trainer OptimizationJob. What can be
validated offline is: each trial's TrainJob against the Trainer's published API models (the package
publishes no OptimizationJob model: the outer fields are checked here against the search they encode),
and the trial's arguments, with values put in for the placeholders, as train_model's own settings."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from tests.helpers.k8s_schema import validate_trainjob
from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.contract.entrypoint import parse_settings

pytestmark = pytest.mark.contract

CONFIG = {
    "space": {
        "train_config.learning_rate": {"type": "float", "low": 0.005, "high": 0.2, "log": True},
        "batch_size": {"type": "categorical", "choices": [32, 64]},
        "train_config.hidden_units": {"type": "categorical", "choices": [[64], [128, 64]]},
        "epochs": {"type": "int", "low": 2, "high": 8, "step": 2},
    },
    "train": {"nproc_per_node": 4, "train_config": {"momentum": 0.9}},
    "objectives": [{"metric": "accuracy"}],
    "n_trials": 12,
    "study_name": "Digits_LR",
    "seed": 5,  # the trials' split
    "sampler_seed": 11,  # the sampler's: its own setting
}


def _emit(tmp_path, config: dict, *extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "tune", "-c", str(path), "--emit", "optimizationjob"]
        + ["-o", str(tmp_path / "oj.yaml"), "--data", "/mnt/data/digits.csv", *extra],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_optimizationjob_encodes_the_search_and_each_trial_is_a_valid_trainjob(tmp_path):
    proc = _emit(tmp_path, CONFIG, "--workers", "3", "--profile", "gpu", "--namespace", "team-a")
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load((tmp_path / "oj.yaml").read_text())
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and doc["kind"] == "OptimizationJob"
    assert doc["metadata"] == {
        "name": "digits-lr",
        "namespace": "team-a",
        "labels": {"app.kubernetes.io/managed-by": "trainpipe", "app.kubernetes.io/component": "tune_model"},
    }
    spec = doc["spec"]
    assert spec["objectives"] == [{"metric": "accuracy", "direction": "maximize"}]
    assert spec["trialConfig"] == {"numTrials": 12, "parallelTrials": 3, "maxFailedTrials": 3}
    assert {"name": "seed", "value": "11"} in spec["algorithm"]["settings"]
    space = {p["name"]: p for p in spec["searchSpace"]}
    assert space["train_config_learning_rate"] == {
        "name": "train_config_learning_rate",
        "parameterType": "double",
        "feasibleSpace": {"min": "0.005", "max": "0.2", "distribution": "logUniform"},
    }
    assert space["epochs"]["feasibleSpace"] == {"min": "2", "max": "8", "step": "2.0"}
    assert space["train_config_hidden_units"]["feasibleSpace"]["list"] == ["[64]", "[128, 64]"]
    template = spec["trialTemplate"]
    assert {p["name"] for p in template["trialParameters"]} == set(space)

    # the trial as a TrainJob: the Trainer's models take it whole, on the GPU profile's resources
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "digits-lr-trial", "namespace": "team-a"},
        "spec": template["trainJob"],
    }
    validate_trainjob(trainjob)
    trainer = template["trainJob"]["trainer"]
    assert trainer["image"].endswith("trainpipe-gpu:0.1.0") and trainer["numProcPerNode"] == 4
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "1"

    # values in for the placeholders: the arguments are train_model's settings, numbers as numbers
    values = {
        "train_config_learning_rate": "0.031",
        "batch_size": "64",
        "train_config_hidden_units": "[128, 64]",
        "epochs": "4",
        "trialName": "trial-7",
    }
    args = [re.sub(r"\$\{trialParameters\.(\w+)\}", lambda m: values[m.group(1)], a) for a in trainer["args"]]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    settings = {k.removeprefix("--").replace("-", "_"): v for k, v in flags.items()}
    config = parse_settings(TrainModelConfig, settings, where="trial")
    assert config.train_config == {"momentum": 0.9, "learning_rate": 0.031, "hidden_units": [128, 64]}
    assert (config.batch_size, config.epochs, config.nproc_per_node) == (64, 4, 4)
    assert config.output_dir == "/mnt/trainpipe/trials/trial-7" and config.test_fraction == 0.2
    assert config.seed == 5  # each trial splits with the study's seed, not the sampler's
    assert json.loads(json.dumps(doc)) == doc  # plain YAML: no Python objects


def test_what_an_optimizationjob_cannot_say_is_refused_in_one_line(tmp_path):
    conditional = json.loads(json.dumps(CONFIG))
    conditional["space"]["train_config.momentum"] = {
        "type": "float",
        "low": 0.5,
        "high": 0.9,
        "when": {"batch_size": 64},
    }
    proc = _emit(tmp_path, conditional)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "space.train_config.momentum.when: an OptimizationJob has no conditional parameters" in proc.stderr
    assert not (tmp_path / "oj.yaml").exists()
    other = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "tune", "-c", str(tmp_path / "tune.yaml"), "--emit", "katib"]
        + ["--data", "x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert other.returncode == 2 and "--emit: 'katib' is not optimizationjob" in other.stderr
