"""train_model: typed config and result. Imports nothing heavy.

Its settings are the library's training settings (:mod:`trainpipe.training.settings`): the ranks,
the launcher and profile_training's own pass read the same type.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainpipe.contract.lineage import TrainingRun
from trainpipe.contract.result import ComponentResult
from trainpipe.services.costs import Usage
from trainpipe.training.settings import ClusterJob, SlurmJob, TrainModelConfig, TrainModelParams

NAME = "train_model"

__all__ = ["NAME", "ClusterJob", "SlurmJob", "TrainModelConfig", "TrainModelParams", "TrainModelResult"]


class TrainModelResult(ComponentResult, TrainingRun):
    """What train_model reports."""

    model_file: str = Field(description="the weights file inside output_dir")
    model_sha256: str = Field(description="sha256 of the weights file")
    model_uri: str = Field(
        "", description="the MLflow pyfunc model logged to the training run (loads without trainpipe)"
    )
    tracking_uri: str = Field(description="the MLflow tracking URI used")
    epochs: int = Field(description="epochs trained")
    final_loss: float | None = Field(
        None, description="the last epoch's mean of the logged loss, when the function logs one"
    )
    metrics: dict[str, float] = Field(
        default_factory=dict, description="the last epoch's mean of every value the function logged"
    )
    diverged_at_epoch: int | None = Field(
        None,
        description="the first epoch (1-based) whose mean loss (loss, or a key ending in _loss) was NaN or infinite; "
        "null while every logged loss stayed finite",
    )
    wall_seconds: float = Field(description="the training's wall time")
    usage: Usage | None = Field(
        None,
        description="what the training used over every attempt: GPU-seconds, CPU-core-seconds and peak memory of its "
        "ranks and of the step's own process (start-up, the MLflow run, logging the model)",
    )
    cost: float | None = Field(None, description="what it cost at the hardware profile's prices (unpriced: none)")
    currency: str | None = Field(None, description="the cost's currency")
    resumed_from_step: int = Field(description="the checkpoint step it resumed from (0: from scratch)")
    global_steps: int = Field(description="optimizer steps taken in all")
    precision: str = Field(description="the precision it trained in (fp32, bf16, fp16)")
    classes: list[Any] = Field(description="the class labels, in the model's output order (classification)")
    feature_columns: list[str] = Field(description="the feature columns, in the model's input order")

    @property
    def train_accuracy(self) -> float | None:
        return self.metrics.get("accuracy")

    def summary(self) -> str:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(self.metrics.items()))
        where = f"{self.world_size}x {self.dist_backend} ({self.device})"
        cost = f", cost {self.cost:.4f} {self.currency}" if self.cost is not None else ""
        gone = f" (its loss diverged at epoch {self.diverged_at_epoch})" if self.diverged_at_epoch is not None else ""
        shown = f"{shown or 'no metrics logged'}{gone}"
        return f"{self.train_function} on {where}: {shown}{cost}, run {self.mlflow_run_id}"

    def series(self) -> list[tuple[str, str, dict[str, str], float]]:
        """What the training used and, on a priced profile, what it cost (Prometheus)."""
        if self.usage is None:
            return []
        from trainpipe.services.costs import series

        labels = {"train_function": self.train_function, "device": self.device}
        return series(self.usage, self.cost, self.currency, labels)
