"""train_model: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT

NAME = "train_model"
MODEL_FILE = "model.safetensors"
MODEL_META = "model.json"
METRICS_FILE = "metrics.jsonl"
TELEMETRY_DIR = "telemetry"
CHECKPOINT_DIR = "checkpoints"


class TrainModelParams(StrictModel):
    """Settings of train_model that are not artifacts."""

    label_column: str = Field("label", min_length=1, description="name of the label column")
    backend: Literal["torch_ddp"] = Field("torch_ddp", description="training backend")
    nproc_per_node: int = Field(2, ge=1, le=256, description="processes (ranks) on this node")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks cuda when present")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on cuda, gloo on cpu")
    epochs: int = Field(10, ge=1, le=100_000)
    batch_size: int = Field(64, ge=1, le=10_000_000, description="global batch size, split evenly across ranks")
    learning_rate: float = Field(0.05, gt=0, le=10)
    hidden_units: list[int] = Field(default_factory=lambda: [64], description="MLP hidden layer widths")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share, the same split evaluate_model uses")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    max_restarts: int = Field(1, ge=0, le=100, description="torchrun restarts of the whole worker group")
    collective_timeout_s: int = Field(300, ge=10, le=86_400, description="bound on a hung collective")
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    experiment_name: str = Field("trainpipe", min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "TrainModelParams":
        if any(h < 1 or h > 65_536 for h in self.hidden_units):
            raise ValueError("hidden_units: every width must be between 1 and 65536")
        if self.batch_size % self.nproc_per_node:
            raise ValueError(f"batch_size {self.batch_size} must be divisible by nproc_per_node {self.nproc_per_node}")
        if self.dist_backend == "nccl" and self.device == "cpu":
            raise ValueError("dist_backend nccl needs device cuda")
        return self


class TrainModelConfig(TrainModelParams):
    """Everything train_model needs, artifacts included."""

    data: str = Field(..., min_length=1, description="the dataset snapshot (snapshot_dataset's output)", json_schema_extra=INPUT)
    output_dir: str = Field(..., min_length=1, description="where the model, checkpoints and telemetry go", json_schema_extra=OUTPUT)
    checkpoint_dir: str | None = Field(None, description="checkpoints (default: <output_dir>/checkpoints); a rerun resumes from it")


class TrainModelResult(BaseModel):
    """What train_model reports."""

    model_file: str
    model_sha256: str
    mlflow_run_id: str
    tracking_uri: str
    experiment_id: str
    backend: str
    dist_backend: str
    device: str
    world_size: int
    epochs: int
    final_loss: float
    train_accuracy: float
    wall_seconds: float
    resumed_from_epoch: int
    classes: list[Any]
    feature_columns: list[str]
    lineage: dict[str, Any] = Field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"{self.world_size}x {self.dist_backend} on {self.device}: loss {self.final_loss:.4f}, "
            f"train accuracy {self.train_accuracy:.3f}, run {self.mlflow_run_id}"
        )
