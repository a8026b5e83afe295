"""What a scheduler's job hands back to the step that submitted it (a Kubernetes TrainJob or PyTorchJob,
a Slurm job): node 0's model files and result, with the step's own lineage and where the job ran."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trainpipe.components.train_model.spec import TrainModelResult
from trainpipe.contract.errors import TrainpipeError
from trainpipe.contract.lineage import Lineage


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
