"""The reference pipeline on kfp.local.DockerRunner, each task in its trainpipe image through podman's
Docker-compatible socket, as the image's non-root user with a read-only root filesystem and no network; and the
same pipeline on kfp.local's SubprocessRunner (``trainpipe run --engine kfp-local``), for comparison.

Both runs build the pipeline the same way from one config; the DockerRunner run registers the same model
version with the same lineage, its steps naming the image they ran in. A task that fails in its container fails
the run: on podman that needs :mod:`tests.images.kfp_podman`'s workaround.

The workspace is the runner's pipeline root, the one folder DockerRunner mounts (at the same path): the data,
the DVC repository and remote and the SQLite tracking store all lie in it.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.pipeline import run_pipeline
from tests.images.conftest import writable
from tests.images.kfp_podman import exit_codes_kept

pytestmark = pytest.mark.images

#: The registered version's tags that may differ between the two runners (ran on 2026-11-28: exactly these did).
VOLATILE_TAGS = {
    "lineage.source.uri",
    "lineage.snapshot.rev",
    "lineage.snapshot.remote",
    "lineage.snapshot.repo",
    "lineage.training.mlflow_run_id",
    "lineage.training.model_uri",
    "lineage.training.wall_seconds",
    "lineage.training.cpu_core_seconds",
    "lineage.training.peak_memory_mb",
    "lineage.code.git_commit",
    "lineage.orchestrator.run_id",
    "lineage.image",
    "trainpipe.training_run_id",
}
TRAIN = {"train_function": "builtin:mlp", "nproc_per_node": 2, "epochs": 2, "batch_size": 64, "seed": 3}


def _config(folder: Path, data: Path | None = None) -> Path:
    from trainpipe.demo import write_digits

    ws = writable(folder / "ws")
    raw = data or write_digits(writable(ws / "raw") / "digits.csv")
    path = folder / "pipeline.yaml"
    settings = {
        "data": str(raw),
        "label_column": "label",
        "workspace": str(ws),
        "dataset_name": "digits",
        "model_name": "digits",
        "thresholds": {"accuracy": 0.8},
        "schedule": None,
        "train": TRAIN,
    }
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return path


@contextlib.contextmanager
def _docker_host(url: str):
    """The ``docker`` SDK (``docker.from_env()``, which DockerRunner calls) reads the engine's URL from here."""
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = url
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before


def run_on_docker(config_path: Path, socket: str) -> dict:
    """The pipeline as ``trainpipe.pipelines.compile.run_local`` builds and runs it, on DockerRunner with the
    workspace as its pipeline root; each component's result."""
    from kfp import local

    from trainpipe.pipelines.compile import run_local
    from trainpipe.pipelines.config import load_pipeline_config
    from trainpipe.services.runs import collect_results

    config = load_pipeline_config(config_path)
    started = time.time()
    with _docker_host(socket), exit_codes_kept():
        runner = local.DockerRunner(network_mode="none", read_only=True)
        run_local(config, runner=runner, pipeline_root=config.workspace)
    return collect_results(config.workspace, since=started)


@pytest.fixture(scope="module")
def docker_run(cpu_image, data_image, podman_socket, tmp_path_factory) -> tuple[Path, dict]:
    """Slow on purpose: every step of the pipeline in a fresh container (torch, TensorFlow and MLflow imported
    in each), a two-rank training of two epochs."""
    config = _config(tmp_path_factory.mktemp("docker"))
    return config, run_on_docker(config, podman_socket)


@pytest.fixture(scope="module")
def subprocess_run(tmp_path_factory) -> tuple[Path, dict]:
    """The same config on kfp.local's SubprocessRunner, as ``trainpipe run`` runs it."""
    from trainpipe.services.runs import collect_results

    folder = tmp_path_factory.mktemp("subprocess")
    config = _config(folder)
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "TRAINPIPE_IMAGE")}
    proc = run_pipeline(config, "kfp-local", folder, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return config, collect_results(folder / "ws" / "kfp-local")


def _version(config: Path):
    import mlflow

    ws = Path(yaml.safe_load(config.read_text())["workspace"])
    client = mlflow.MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    return client.get_model_version_by_alias("digits", "champion")


def test_the_pipeline_on_docker_runner_registers_what_the_subprocess_runner_registers(docker_run, subprocess_run):
    from trainpipe.services.images import image_for

    (docker_config, docker), (local_config, local) = docker_run, subprocess_run
    assert set(docker) == set(local) and {"validate_data", "train_model", "register_model"} <= set(docker)
    assert docker["snapshot_dataset"]["md5"] == local["snapshot_dataset"]["md5"]  # the same bytes, snapshotted
    on_docker, on_host = _version(docker_config), _version(local_config)
    assert str(on_docker.version) == str(on_host.version) == "1"
    assert set(on_docker.tags) == set(on_host.tags), set(on_docker.tags) ^ set(on_host.tags)
    differ = {k for k in on_host.tags if on_docker.tags[k] != on_host.tags[k]}
    # only where things were written, ids, the code's commit (the image's build), the image, and how fast the
    # machine ran: the model's metrics and the data's hashes agree
    assert {k for k in differ if not k.startswith("lineage.training_profile.")} <= VOLATILE_TAGS, {
        k: (on_docker.tags[k], on_host.tags[k]) for k in differ
    }
    assert on_docker.tags["lineage.image"] == image_for("register_model")
    assert on_host.tags["lineage.image"] == "local"


def test_a_task_failing_in_its_container_fails_the_run(cpu_image, data_image, podman_socket, tmp_path, digits_csv):
    """validate_data exits 3 on data without its label: the run stops there, nothing is snapshotted. (kfp's
    runner as it is loses that exit code on podman and goes on: see tests.images.kfp_podman.)"""
    import pandas as pd

    ws = writable(tmp_path / "ws")
    bad = writable(ws / "raw") / "bad.csv"
    pd.read_csv(digits_csv).drop(columns=["label"]).to_csv(bad, index=False)
    with pytest.raises(RuntimeError, match="validate-data"):
        run_on_docker(_config(tmp_path, data=bad), podman_socket)
    assert not (ws / "dvc-remote").exists(), "a step after validate_data ran"
