"""What a node of the training reports: node 0's result from what its ranks made and the run they were
logged to (:func:`chief`), a worker node's (:func:`worker`), and what a scheduler's job hands back to the
step that submitted it (:func:`adopt`: a Kubernetes TrainJob or PyTorchJob, a Slurm job): node 0's model
files and result, with the step's own lineage and where the job ran."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trainpipe.components.train_model.spec import TrainModelConfig, TrainModelResult
from trainpipe.contract.errors import TrainpipeError
from trainpipe.contract.layout import MODEL_FILE, TELEMETRY_DIR
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.text import redact
from trainpipe.training.tracking_run import TrackingThread


def adopt(result_file: Path, model_dir: Path, output_dir: str, lineage: Lineage, job: str) -> TrainModelResult:
    """Copy node 0's model into ``output_dir`` and make its result this step's, recording ``job``.

    Raises:
        TrainpipeError: node 0 wrote no result, or one without its training lineage.
    """
    if not result_file.is_file():
        raise TrainpipeError(f"{job}: the job finished but node 0 wrote no result at {result_file}")
    payload = json.loads(result_file.read_text(encoding="utf-8"))
    out = Path(output_dir)
    for item in model_dir.iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copy2(item, out / item.name)
        elif item.is_dir() and item.name == "telemetry":
            shutil.copytree(item, out / item.name, dirs_exist_ok=True)
    node = Lineage.of(payload.pop("lineage", None))
    result = TrainModelResult.model_validate(payload)
    if node.training is None:
        raise TrainpipeError(f"{job}: node 0's result at {result_file} carries no training lineage")
    sections: dict = {"training": node.training.model_copy(update={"cluster_job": job})}
    if node.orchestrator is not None and (lineage.orchestrator is None or lineage.orchestrator.name == "manual"):
        sections["orchestrator"] = node.orchestrator  # submitted by hand: the scheduler ran it (slurm, its job id)
    result.lineage = lineage.with_(**sections)
    return result


def chief(
    config: TrainModelConfig,
    t: TrackingThread,
    out: Path,
    meta: dict[str, Any],
    last: dict[str, float],
    wall: float,
    sha: str,
    model_uri: str,
    usage: Any,
    spent: dict[str, float],
    prices: Any,
) -> TrainModelResult:
    """The step's result from the model's description, the last epoch's means and rank 0's telemetry."""
    telemetry0 = json.loads((out / TELEMETRY_DIR / "rank0.json").read_text(encoding="utf-8"))
    return TrainModelResult(
        model_file=MODEL_FILE,
        model_sha256=sha,
        model_uri=model_uri,
        mlflow_run_id=t.run_id,
        tracking_uri=redact(t.uri),
        experiment_id=t.exp_id,
        train_function=config.train_function,
        task=config.task,
        backend=config.backend,
        dist_backend=meta["dist_backend"],
        device=meta["device"],
        world_size=int(meta["world_size"]),
        epochs=config.epochs,
        final_loss=last.get("loss"),
        metrics=last,
        wall_seconds=round(wall, 3),
        usage=usage,
        cost=spent.get("cost"),
        currency=prices.currency if prices is not None else None,
        resumed_from_step=int(telemetry0.get("resumed_from_step", 0)),
        global_steps=int(telemetry0.get("global_steps", 0)),
        precision=config.precision,
        classes=meta.get("classes", []),
        feature_columns=meta["feature_columns"],
    )


def worker(config: TrainModelConfig, wall: float, lineage: Lineage) -> TrainModelResult:
    """A non-chief node's result: its ranks ran; node 0 reports the model."""
    return TrainModelResult(
        model_file="",
        model_sha256="",
        mlflow_run_id="",
        tracking_uri="",
        experiment_id="",
        train_function=config.train_function,
        task=config.task,
        backend=config.backend,
        dist_backend="",
        device="",
        world_size=config.world_size,
        epochs=config.epochs,
        wall_seconds=round(wall, 3),
        resumed_from_step=0,
        global_steps=0,
        precision=config.precision,
        classes=[],
        feature_columns=[],
        lineage=lineage,
    )
