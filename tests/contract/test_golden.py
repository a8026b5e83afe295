"""Golden compile tests: the compiled reference pipeline per profile and each component's
reusable spec are checked in (`make golden` regenerates them), match a fresh compile, and
validate against the KFP pipeline spec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from trainpipe import COMPONENTS
from trainpipe.contract.errors import InputError
from trainpipe.pipelines.compile import validate_pipeline_yaml

pytestmark = pytest.mark.contract

GOLDEN = REPO / "pipelines" / "golden"


def _same_sdk(text: str) -> str:
    """The compiled text without the compiling kfp's version: trainpipe admits a range of kfp, and the
    golden files are compiled with the locked one (images/constraints.txt)."""
    import re

    return re.sub(r"^sdkVersion: kfp-\S+$", "sdkVersion: kfp", text, flags=re.M)


def _env() -> dict:
    env = dict(os.environ)
    env.pop("TRAINPIPE_IMAGE", None)  # the golden files use the default image
    return env


def test_a_bare_compile_never_takes_the_demos_config(tmp_path, monkeypatch):
    """CI runs ``make demo`` before the suite: a bare ``trainpipe compile`` in the checkout then found the demo's
    ``.trainpipe/demo/pipeline.yaml`` and compiled its data's names as the defaults (the golden test failed in
    CI only). compile and schedule fall back to ``./pipeline.yaml`` alone, as their ``--help`` says."""
    from trainpipe.app.cli import default_config
    from trainpipe.demo import write_demo_config

    write_demo_config(tmp_path / ".trainpipe" / "demo")
    env = {k: v for k, v in _env().items() if k != "TRAINPIPE_CONFIG"}
    out = tmp_path / "p.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "compile", "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trainpipe-digits" not in out.read_text()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAINPIPE_CONFIG", raising=False)
    assert default_config(None, required=False, demo=False) is None
    assert default_config(None, required=False) == Path(".trainpipe/demo/pipeline.yaml")  # run's fallback


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_compiled_pipeline_matches_the_golden_file_and_the_spec(tmp_path, profile):
    out = tmp_path / f"pipeline-{profile}.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "compile", "--profile", profile, "-o", str(out)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    golden = GOLDEN / f"pipeline-{profile}.yaml"
    assert _same_sdk(out.read_text()) == _same_sdk(golden.read_text()), (
        f"{golden.name} is out of date: run `make golden` and review the diff"
    )
    validate_pipeline_yaml(golden)


def _tasks(spec: dict) -> dict:
    """Every task of a compiled pipeline, those inside conditions too."""
    tasks = dict(spec["root"]["dag"]["tasks"])
    for comp in spec["components"].values():
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    return tasks


def test_the_spec_validator_rejects_what_kfp_would(tmp_path):
    docs = list(yaml.safe_load_all((GOLDEN / "pipeline-cpu.yaml").read_text()))
    _tasks(docs[0])["train-model"]["retryPolicy"]["maxRetries"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    with pytest.raises(InputError, match="not a valid KFP pipeline spec"):
        validate_pipeline_yaml(bad)


def test_caching_keys_include_the_dvc_content_hash():
    tasks = _tasks(next(yaml.safe_load_all((GOLDEN / "pipeline-cpu.yaml").read_text())))
    # validate and snapshot read data that can change behind one URI, detect_drift the champion,
    # which moves between runs: never cached
    for name in ("validate-data", "snapshot-dataset", "detect-drift"):
        assert not tasks[name]["cachingOptions"].get("enableCache"), name
    # every later data-consuming task takes the snapshot's md5 as a parameter: part of its cache key
    for name in ("detect-drift", "train-model", "evaluate-model"):
        md5 = tasks[name]["inputs"]["parameters"]["dataset_md5"]
        # inside a condition, the snapshot's output reaches the task through the condition's channel
        assert md5 in (
            {"taskOutputParameter": {"outputParameterKey": "md5", "producerTask": "snapshot-dataset"}},
            {"componentInputParameter": "pipelinechannel--snapshot-dataset-md5"},
        ), name
    for name in ("train-model", "evaluate-model"):
        assert tasks[name]["cachingOptions"]["enableCache"] is True
    retry = tasks["train-model"]["retryPolicy"]
    assert retry["backoffMaxDuration"] == "600s" and retry["backoffFactor"] == 2.0


def test_component_specs_are_up_to_date_and_load_without_trainpipe(tmp_path):
    from kfp.components import load_component_from_file

    proc = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "components", "export", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{c}.yaml" for c in COMPONENTS)
    for name in COMPONENTS:
        shipped = REPO / "components" / name / "component.yaml"
        assert _same_sdk((tmp_path / f"{name}.yaml").read_text()) == _same_sdk(shipped.read_text()), (
            f"{shipped} is out of date: run `make golden`"
        )
        comp = load_component_from_file(str(shipped))
        assert comp.name == name.replace("_", "-")
    train = load_component_from_file(str(REPO / "components" / "train_model" / "component.yaml"))
    assert {"data", "train_function", "train_config", "backend", "precision", "nnodes", "dataset_md5"} <= set(
        train.component_spec.inputs
    )


def test_profile_settings_reach_the_platform_spec_and_secrets_stay_names(tmp_path):
    profile = tmp_path / "team.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": "team-a",
                "train": {"accelerator_type": "nvidia.com/mig-1g.10gb", "accelerator_count": 1},
                "node_selector": {"pool": "gpu"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "node_affinity": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["me-central-1a"]}
                ],
                "image_pull_secrets": ["regcred"],
                "secrets_as_env": {
                    "mlflow-credentials": {
                        "username": "MLFLOW_TRACKING_USERNAME",
                        "password": "MLFLOW_TRACKING_PASSWORD",
                    }
                },
                "volumes": {"team-a-train": "/mnt/trainpipe"},
                "train_timeout_s": 7200,
            }
        )
    )
    out = tmp_path / "p.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "compile", "--profile", str(profile), "-o", str(out)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    validate_pipeline_yaml(out)
    spec, platform = list(yaml.safe_load_all(out.read_text()))
    execs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    train = execs["exec-train-model"]
    assert train["nodeSelector"]["labels"] == {"pool": "gpu"} and train["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert train["activeDeadlineSeconds"] == "7200" or train["activeDeadlineSeconds"] == 7200
    assert train["pvcMount"][0]["mountPath"] == "/mnt/trainpipe"
    assert {s["secretName"] for e in execs.values() for s in e.get("secretAsEnv", [])} == {"mlflow-credentials"}
    assert all(e["imagePullSecret"][0]["secretName"] == "regcred" for e in execs.values())
    assert (
        spec["deploymentSpec"]["executors"]["exec-train-model"]["container"]["resources"]["accelerator"]["resourceType"]
        == "nvidia.com/mig-1g.10gb"
    )
