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


BUILTIN_MODELS = ("mlp", "cnn")


class ClusterJob(StrictModel):
    """Where a multi-node job runs on Kubernetes (used when nnodes > 1)."""

    launcher: Literal["trainjob", "pytorchjob"] = Field("trainjob", description="Kubeflow Trainer TrainJob, or the legacy PyTorchJob")
    namespace: str = Field("kubeflow", min_length=1)
    runtime: str = Field("torch-distributed", min_length=1, description="the TrainJob's ClusterTrainingRuntime")
    image: str | None = Field(None, description="the trainpipe image every node runs (default: TRAINPIPE_IMAGE)")
    profile: str = Field("gpu", description="hardware profile of each node: cpu, gpu or a YAML file")
    shared_pvc: str = Field(..., min_length=1, description="a ReadWriteMany PVC mounted by this step and by every node")
    mount_path: str = Field("/mnt/trainpipe", description="where the PVC is mounted, in this step's pod and on the nodes")
    job_name: str | None = Field(None, description="default: trainpipe-train-<random>")
    poll_s: float = Field(10, gt=0, le=600)
    timeout_s: float = Field(86_400, gt=0, le=30 * 86_400)


class TrainModelParams(StrictModel):
    """Settings of train_model that are not artifacts."""

    label_column: str = Field("label", min_length=1, description="name of the label column")
    backend: Literal["torch_ddp", "tensorflow", "horovod"] = Field(
        "torch_ddp", description="torch_ddp (torchrun), tensorflow (MultiWorkerMirroredStrategy) or horovod (PyTorch binding)"
    )
    horovod_binding: Literal["torch", "tensorflow"] = Field(
        "torch", description="Horovod framework binding; only torch builds against this stack"
    )
    model: str = Field(
        "mlp",
        min_length=1,
        description="mlp, cnn (image-shaped rows), or your own 'package.module:function' returning a model",
    )
    image_shape: list[int] | None = Field(
        None, description="[height, width] or [channels, height, width] of each row for cnn; default: a square of the feature count"
    )
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments passed to your model function")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="bf16 runs on CPU and GPU; fp16 needs CUDA")
    nproc_per_node: int = Field(2, ge=1, le=256, description="processes (ranks) on this node")
    nnodes: int = Field(1, ge=1, le=4096, description="nodes in the job; > 1 needs rdzv_endpoint (or MASTER_ADDR/MASTER_PORT)")
    node_rank: int | None = Field(None, ge=0, description="this node's rank (default: NODE_RANK / PET_NODE_RANK / RANK from the environment)")
    rdzv_endpoint: str | None = Field(None, description="host:port of the rendezvous (multi-node)")
    cluster: ClusterJob | None = Field(None, description="run a multi-node job (nnodes > 1) through the Kubeflow Trainer")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks cuda when present")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on cuda, gloo on cpu")
    epochs: int = Field(10, ge=1, le=100_000)
    max_steps: int | None = Field(None, ge=1, le=10**9, description="stop after this many optimizer steps (a short profiling pass)")
    batch_size: int = Field(64, ge=1, le=10_000_000, description="global batch size, split evenly across all ranks")
    learning_rate: float = Field(0.05, gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    hidden_units: list[int] = Field(default_factory=lambda: [64], description="MLP hidden layer widths")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share, the same split evaluate_model uses")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    max_restarts: int = Field(3, ge=0, le=100, description="restarts of the whole worker group after a failure; each resumes from the newest checkpoint")
    collective_timeout_s: int = Field(300, ge=10, le=86_400, description="bound on a hung collective: never an endless wait")
    profile_steps: int = Field(
        0, ge=0, le=10_000, description="trace this many steps with torch.profiler on rank 0 (after 4 warm-up steps); 0: off"
    )
    checkpoint_every_steps: int = Field(50, ge=0, le=10**9, description="also checkpoint every N steps (0: only at epoch ends)")
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    experiment_name: str = Field("trainpipe", min_length=1)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @model_validator(mode="after")
    def _check(self) -> "TrainModelParams":
        if any(h < 1 or h > 65_536 for h in self.hidden_units):
            raise ValueError("hidden_units: every width must be between 1 and 65536")
        if self.batch_size % self.world_size:
            raise ValueError(
                f"batch_size: {self.batch_size} must be divisible by the world size {self.world_size} (nproc_per_node x nnodes)"
            )
        if self.dist_backend == "nccl" and self.device == "cpu":
            raise ValueError("dist_backend: nccl needs device cuda")
        if self.model not in BUILTIN_MODELS and not _is_entry_point(self.model):
            raise ValueError(f"model: {self.model!r} is neither mlp, cnn nor 'package.module:function'")
        if self.image_shape is not None and (len(self.image_shape) not in (2, 3) or min(self.image_shape) < 1):
            raise ValueError("image_shape: give [height, width] or [channels, height, width], all positive")
        if self.backend == "horovod" and self.horovod_binding == "tensorflow":
            raise ValueError(
                "horovod_binding: tensorflow is not available: Horovod 0.28.1's TensorFlow ops do not build against "
                "TensorFlow 2.21; use backend tensorflow (MultiWorkerMirroredStrategy) or horovod with the torch binding"
            )
        if self.nnodes > 1 and self.backend == "horovod":
            raise ValueError("nnodes: multi-node horovod runs under an MPIJob or horovodrun with hosts; use torch_ddp or tensorflow for nnodes > 1")
        return self


def _is_entry_point(value: str) -> bool:
    module, sep, func = value.partition(":")
    return bool(sep) and all(p.isidentifier() for p in module.split(".")) and func.isidentifier()


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
    resumed_from_step: int
    global_steps: int
    precision: str
    model_arch: str
    classes: list[Any]
    feature_columns: list[str]
    lineage: dict[str, Any] = Field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"{self.world_size}x {self.dist_backend} on {self.device}: loss {self.final_loss:.4f}, "
            f"train accuracy {self.train_accuracy:.3f}, run {self.mlflow_run_id}"
        )
