"""train_model: the launcher. Checks the inputs, opens the MLflow run, starts the
backend's ranks (see launch.py) and turns what they wrote into a typed result.
No ML framework is imported here: only in the ranks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from trainpipe.components.train_model import launch
from trainpipe.components.train_model.data import prepare_data
from trainpipe.components.train_model.spec import (
    METRICS_FILE,
    MODEL_FILE,
    MODEL_META,
    NAME,
    TELEMETRY_DIR,
    TrainModelConfig,
    TrainModelResult,
)
from trainpipe.contract import errors
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json, file_digest
from trainpipe.resources import threads_per_rank
from trainpipe.tabular import find_data_file

#: What each backend needs installed, and how to get it.
BACKEND_MODULES = {
    "torch_ddp": ("torch", "pip install 'trainpipe[torch]'"),
    "tensorflow": ("tensorflow", "pip install 'trainpipe[tensorflow]'"),
    "horovod": ("horovod", "make horovod (builds Horovod 0.28.1 with C++17 into a wheel cache)"),
}


def check_inputs(config: TrainModelConfig) -> dict[str, Any]:
    """Fail fast, in one line, before any rank starts; returns the prepared data."""
    module, how = BACKEND_MODULES[config.backend]
    if importlib.util.find_spec(module) is None:
        raise InputError(f"backend: {config.backend} needs {module}, which is not installed ({how})")
    if config.backend == "tensorflow" and config.model not in ("mlp", "cnn"):
        raise InputError(f"model: a custom model function ({config.model}) runs on the torch backends; with backend tensorflow use mlp or cnn")
    wants_cuda = config.device == "cuda" or config.dist_backend == "nccl"
    gpus = cuda_device_count() if (wants_cuda or config.precision == "fp16" or config.device == "auto") else 0
    if wants_cuda and gpus == 0:
        raise InputError("device: cuda requested but no CUDA device is visible")
    if config.precision == "fp16" and (gpus == 0 or config.device == "cpu"):
        raise InputError("precision: fp16 needs a CUDA device (use bf16 on CPU)")
    uses_gpus = gpus > 0 and config.device != "cpu"
    if uses_gpus and config.backend != "tensorflow" and config.nproc_per_node > gpus:
        raise InputError(f"nproc_per_node: {config.nproc_per_node} GPU ranks requested but only {gpus} GPUs are visible on this node")
    data = prepare_data(config)
    if config.model not in ("mlp", "cnn"):
        # A user's model function is called once here (torch is imported for it), so a wrong
        # signature or return type is one line before any rank starts.
        from trainpipe.components.train_model.models import build_model

        build_model(config.model, data["input_shape"], len(data["classes"]), config.hidden_units, config.model_kwargs)
    return data


def cuda_device_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def rank_env(config: TrainModelConfig) -> dict[str, str]:
    """The ranks' environment: threads per rank from the usable CPUs unless OMP_NUM_THREADS is set;
    TensorFlow's thread pools follow the same figure unless its own variables are set (an
    OMP_NUM_THREADS alone once left TF workers each using every core)."""
    env = dict(os.environ)
    threads = env.get("OMP_NUM_THREADS") or str(threads_per_rank(config.nproc_per_node))
    env["OMP_NUM_THREADS"] = threads
    env.setdefault("TF_NUM_INTRAOP_THREADS", threads)
    env.setdefault("TF_NUM_INTEROP_THREADS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if config.backend == "tensorflow" and (config.device == "cpu" or cuda_device_count() == 0):
        env["CUDA_VISIBLE_DEVICES"] = ""  # TF would otherwise probe for CUDA and log errors on CPU hosts
    return env


def train_model(config: TrainModelConfig, lineage: dict[str, Any]) -> TrainModelResult:
    """Train with the configured backend and log the run to MLflow.

    On a multi-node job every node runs this; node 0 alone opens the MLflow run and
    reports the model, the other nodes only run their ranks.

    Args:
        config: Settings and paths.
        lineage: The lineage so far; ``training`` is added.

    Returns:
        The model's hash, the MLflow run id and the training figures.

    Raises:
        InputError: bad data or settings (also when a rank reports one).
        ServiceUnavailable: MLflow cannot be reached.
        TrainpipeError: the ranks failed beyond ``max_restarts``.
    """
    find_data_file(config.data, "data")
    if config.cluster is not None and config.nnodes > 1:
        from trainpipe.components.train_model.k8s import run_cluster_job

        return run_cluster_job(config, lineage)
    check_inputs(config)
    out = Path(config.output_dir)
    chief = launch.node_rank(config) == 0
    client = run_id = exp_id = uri = None
    if chief:
        from trainpipe import tracking

        client = tracking.connect(config.tracking_uri)
        uri = tracking.resolve_tracking_uri(config.tracking_uri)
        exp_id = tracking.ensure_experiment(client, config.experiment_name, uri)
        tracking.prepare_artifact_store(client, experiment_id=exp_id)
        snapshot = lineage.get("snapshot", {})
        run_id, reused = _training_run(client, exp_id, config, snapshot, lineage.get("orchestrator", {}).get("run_id", ""))
        if not reused:
            log_dataset(run_id, config, snapshot)
        params = config.model_dump(exclude={"data", "output_dir", "checkpoint_dir", "tracking_uri", "cluster"})
        for k, v in params.items():
            client.log_param(run_id, k, json.dumps(v) if isinstance(v, (list, dict)) else v)

    shutil.rmtree(out / ".errors", ignore_errors=True)
    shutil.rmtree(out / TELEMETRY_DIR, ignore_errors=True)
    config_path = out / f".train_config.node{launch.node_rank(config)}.json"
    atomic_write_json(config_path, config.model_dump(mode="json"))
    t0 = time.perf_counter()
    code = launch.launch(config, config_path, rank_env(config))
    wall = time.perf_counter() - t0
    config_path.unlink(missing_ok=True)
    rank_errors = sorted((out / ".errors").glob("rank*.json")) if (out / ".errors").exists() else []
    if code != 0 or rank_errors:
        if client is not None:
            client.set_terminated(run_id, status="FAILED")
        if rank_errors:
            err = json.loads(rank_errors[0].read_text(encoding="utf-8"))
            cls = getattr(errors, err.get("type", ""), errors.TrainpipeError)
            raise cls(err.get("message", "a rank failed"))
        raise errors.TrainpipeError(
            f"training failed: the {config.backend} ranks exited with {code} after up to {config.max_restarts} restarts (rank logs above)"
        )
    if not chief:
        return _worker_node_result(config, wall, lineage)
    meta = json.loads((out / MODEL_META).read_text(encoding="utf-8"))
    history = [json.loads(line) for line in (out / METRICS_FILE).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not client.get_metric_history(run_id, "train_loss"):  # a retried attempt logs its history once
        for h in history:
            client.log_metric(run_id, "train_loss", h["loss"], step=h["epoch"])
            client.log_metric(run_id, "train_accuracy", h["accuracy"], step=h["epoch"])
    client.log_metric(run_id, "train_wall_seconds", wall)
    for name in (MODEL_META, METRICS_FILE):
        client.log_artifact(run_id, str(out / name), artifact_path="train_model")
    sha = file_digest(out / MODEL_FILE, "sha256")
    client.set_tag(run_id, "trainpipe.model_sha256", sha)
    client.set_terminated(run_id, status="FINISHED")
    result = TrainModelResult(
        model_file=MODEL_FILE,
        model_sha256=sha,
        mlflow_run_id=run_id,
        tracking_uri=tracking.redact(uri),
        experiment_id=exp_id,
        backend=config.backend,
        dist_backend=meta["dist_backend"],
        device=meta["device"],
        world_size=int(meta["world_size"]),
        epochs=config.epochs,
        final_loss=history[-1]["loss"],
        train_accuracy=history[-1]["accuracy"],
        wall_seconds=round(wall, 3),
        resumed_from_step=int(meta.get("resumed_from_step", 0)),
        global_steps=int(meta.get("global_steps", 0)),
        precision=config.precision,
        model_arch=config.model,
        classes=meta["classes"],
        feature_columns=meta["feature_columns"],
    )
    lineage = dict(lineage)
    lineage["training"] = {
        "mlflow_run_id": run_id,
        "experiment_id": exp_id,
        "backend": config.backend,
        "dist_backend": result.dist_backend,
        "device": result.device,
        "world_size": result.world_size,
        "precision": config.precision,
        "model": config.model,
        "hardware_profile": os.environ.get("TRAINPIPE_HARDWARE_PROFILE", "local"),
        "model_sha256": sha,
        "final_loss": round(result.final_loss, 6),
    }
    result.lineage = lineage
    return result


def _training_run(client: Any, exp_id: str, config: TrainModelConfig, snapshot: dict[str, Any], orchestrator_run: str) -> tuple[str, bool]:
    """The MLflow run of this training: a retry of the same orchestrator run on the same data and
    settings reuses the run its earlier attempt opened, so a retried task makes no duplicate run.

    Returns:
        The run id, and whether it was reused.
    """
    import hashlib

    settings = json.dumps(config.model_dump(mode="json", exclude={"output_dir", "checkpoint_dir", "tracking_uri"}), sort_keys=True)
    key = hashlib.sha256(f"{orchestrator_run}|{snapshot.get('md5', '')}|{settings}".encode()).hexdigest()
    if orchestrator_run:
        found = client.search_runs([exp_id], filter_string=f"tags.`trainpipe.attempt_key` = '{key}'", max_results=1)
        if found:
            client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id, True
    run = client.create_run(
        exp_id,
        tags={
            "mlflow.runName": f"train-{snapshot.get('md5', 'data')[:8]}",
            "trainpipe.component": NAME,
            "trainpipe.dataset_md5": snapshot.get("md5", ""),
            "trainpipe.orchestrator_run_id": orchestrator_run,
            "trainpipe.attempt_key": key,
        },
    )
    return run.info.run_id, False


def log_dataset(run_id: str, config: TrainModelConfig, snapshot: dict[str, Any]) -> None:
    """Log the snapshot as the run's training input (``mlflow.log_input``), so the MLflow UI shows it."""
    import mlflow

    from trainpipe.tabular import read_table

    df = read_table(config.data, "data")
    source = f"{snapshot['remote']}#{snapshot['path']}@{snapshot['rev']}" if snapshot.get("remote") else str(find_data_file(config.data, "data"))
    dataset = mlflow.data.from_pandas(df, source=source, targets=config.label_column, name=Path(snapshot.get("path") or config.data).name)
    with mlflow.start_run(run_id=run_id):
        mlflow.log_input(dataset, context="training", tags={"trainpipe.dataset_md5": snapshot.get("md5", "")})


def _worker_node_result(config: TrainModelConfig, wall: float, lineage: dict[str, Any]) -> TrainModelResult:
    """A non-chief node's result: its ranks ran; node 0 reports the model."""
    return TrainModelResult(
        model_file="", model_sha256="", mlflow_run_id="", tracking_uri="", experiment_id="",
        backend=config.backend, dist_backend="", device="", world_size=config.world_size, epochs=config.epochs,
        final_loss=float("nan"), train_accuracy=float("nan"), wall_seconds=round(wall, 3), resumed_from_step=0,
        global_steps=0, precision=config.precision, model_arch=config.model, classes=[], feature_columns=[], lineage=lineage,
    )


__all__ = ["NAME", "check_inputs", "train_model"]
