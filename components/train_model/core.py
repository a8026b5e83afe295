"""train_model: the launcher. Checks the inputs, opens the MLflow run, runs torchrun,
and turns what the ranks wrote into a typed result. torch is imported only in the ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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
from trainpipe.components.train_model.worker import prepare_data
from trainpipe.tabular import find_data_file


def _check_inputs(config: TrainModelConfig) -> None:
    """Fail fast, in one line, before any rank starts: the ranks' own data preparation, run once here."""
    prepare_data(config)
    if config.device == "cuda" or config.dist_backend == "nccl":
        gpus = _cuda_device_count()
        if gpus == 0:
            raise InputError("device: cuda requested but no CUDA device is visible")
        if config.nproc_per_node > gpus:
            raise InputError(f"nproc_per_node: {config.nproc_per_node} ranks requested but only {gpus} GPUs are visible")


def _cuda_device_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def torchrun_command(config: TrainModelConfig, config_path: Path) -> list[str]:
    """The torchrun command line for a single-node job."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={config.nproc_per_node}",
        f"--max-restarts={config.max_restarts}",
        "-m",
        "trainpipe.components.train_model.worker",
        str(config_path),
    ]


def train_model(config: TrainModelConfig, lineage: dict[str, Any]) -> TrainModelResult:
    """Train the model with torchrun and log the run to MLflow.

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
    _check_inputs(config)
    out = Path(config.output_dir)
    from trainpipe import tracking

    client = tracking.connect(config.tracking_uri)
    uri = tracking.resolve_tracking_uri(config.tracking_uri)
    exp_id = tracking.ensure_experiment(client, config.experiment_name, uri)
    snapshot = lineage.get("snapshot", {})
    run = client.create_run(
        exp_id,
        tags={
            "mlflow.runName": f"train-{snapshot.get('md5', 'data')[:8]}",
            "trainpipe.component": NAME,
            "trainpipe.dataset_md5": snapshot.get("md5", ""),
            "trainpipe.orchestrator_run_id": lineage.get("orchestrator", {}).get("run_id", ""),
        },
    )
    run_id = run.info.run_id
    params = config.model_dump(exclude={"data", "output_dir", "checkpoint_dir", "tracking_uri"})
    for k, v in params.items():
        client.log_param(run_id, k, json.dumps(v) if isinstance(v, (list, dict)) else v)

    shutil.rmtree(out / ".errors", ignore_errors=True)
    shutil.rmtree(out / TELEMETRY_DIR, ignore_errors=True)
    config_path = out / ".train_config.json"
    atomic_write_json(config_path, config.model_dump(mode="json"))
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads_per_rank(config.nproc_per_node))
    t0 = time.perf_counter()
    proc = subprocess.run(torchrun_command(config, config_path), env=env, check=False)
    wall = time.perf_counter() - t0
    rank_errors = sorted((out / ".errors").glob("rank*.json")) if (out / ".errors").exists() else []
    if proc.returncode != 0 or rank_errors:
        client.set_terminated(run_id, status="FAILED")
        if rank_errors:
            err = json.loads(rank_errors[0].read_text(encoding="utf-8"))
            cls = getattr(errors, err.get("type", ""), errors.TrainpipeError)
            raise cls(err.get("message", "a rank failed"))
        raise errors.TrainpipeError(
            f"training failed: torchrun exited with {proc.returncode} after up to {config.max_restarts} restarts (rank logs above)"
        )
    meta = json.loads((out / MODEL_META).read_text(encoding="utf-8"))
    history = [json.loads(l) for l in (out / METRICS_FILE).read_text(encoding="utf-8").splitlines() if l.strip()]
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
        resumed_from_epoch=int(meta.get("resumed_from_epoch", 0)),
        classes=meta["classes"],
        feature_columns=meta["feature_columns"],
    )
    config_path.unlink(missing_ok=True)
    lineage = dict(lineage)
    lineage["training"] = {
        "mlflow_run_id": run_id,
        "experiment_id": exp_id,
        "backend": config.backend,
        "dist_backend": result.dist_backend,
        "device": result.device,
        "world_size": result.world_size,
        "model_sha256": sha,
        "final_loss": round(result.final_loss, 6),
    }
    result.lineage = lineage
    return result


__all__ = ["NAME", "torchrun_command", "train_model"]
