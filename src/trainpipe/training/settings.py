"""train_model's settings: what a training run is told, whichever face, launcher or backend starts it.

The library's own type (the ranks, the launcher and the profiling pass read it); train_model's spec
is this type and its result. Imports nothing heavy: schedulers and the compiler import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import OUTPUT, SOURCE, settings_input
from trainpipe.contract.layout import CHECKPOINT_DIR, TUNED_SETTINGS_FILE
from trainpipe.contract.tasks import Task
from trainpipe.training.backends import BACKENDS, BackendName
from trainpipe.training.builtin import NAMES as BUILTIN_FUNCTIONS


class ClusterJob(StrictModel):
    """Where a multi-node job runs on Kubernetes (used when nnodes > 1)."""

    launcher: Literal["trainjob", "pytorchjob"] = Field(
        "trainjob", description="Kubeflow Trainer TrainJob, or the legacy PyTorchJob"
    )
    namespace: str | None = Field(
        None, min_length=1, description="where the job goes (default: the profile's team namespace, else kubeflow)"
    )
    runtime: str = Field("torch-distributed", min_length=1, description="the TrainJob's ClusterTrainingRuntime")
    image: str | None = Field(None, description="the trainpipe image every node runs (default: TRAINPIPE_IMAGE)")
    profile: str = Field("gpu", description="hardware profile of each node: cpu, gpu or a YAML file")
    shared_pvc: str = Field(..., min_length=1, description="a ReadWriteMany PVC mounted by this step and by every node")
    mount_path: str = Field(
        "/mnt/trainpipe", description="where the PVC is mounted, in this step's pod and on the nodes"
    )
    job_name: str | None = Field(
        None,
        description="default: trainpipe-train-<hash of the run id and the step's output>; a retry reattaches to it",
    )
    poll_s: float = Field(10, gt=0, le=600)
    timeout_s: float = Field(86_400, gt=0, le=30 * 86_400)


class SlurmJob(StrictModel):
    """Where a job runs on Slurm: the step writes an sbatch script, submits it, waits, and takes node 0's model.

    The data, the output and ``workdir`` must be on a filesystem every node sees (a cluster's home or
    scratch), and the nodes run ``python`` with trainpipe installed (the same venv on that filesystem).
    """

    partition: str | None = Field(None, min_length=1, description="--partition (default: the cluster's default)")
    account: str | None = Field(None, min_length=1, description="--account charged for the job")
    qos: str | None = Field(None, min_length=1, description="--qos")
    time_limit: str | None = Field(
        None,
        pattern=r"^(\d+-)?\d+(:\d{1,2}){0,2}$",
        description="--time as Slurm writes it (minutes, HH:MM:SS, D-HH:MM:SS); default: the profile's train_timeout_s",
    )
    profile: str = Field("gpu", description="hardware profile of each node (CPUs, memory, GPUs): cpu, gpu, a YAML file")
    requeue: bool = Field(
        True, description="--requeue: a preempted job, or one warned before its time limit, is requeued and resumes"
    )
    signal_s: int = Field(
        120,
        ge=0,
        le=65_535,
        description="--signal=USR1@N: checkpoint and requeue N s before the time limit; 0: off",
    )
    workdir: str | None = Field(
        None,
        description="the job's folder on the shared filesystem: script, log, checkpoints (default: <output_dir>/slurm)",
    )
    python: str | None = Field(None, min_length=1, description="the interpreter on the nodes (default: this one)")
    setup: list[str] = Field(
        default_factory=list, description="shell lines run on each node before training (module load, source a venv)"
    )
    sbatch_args: list[str] = Field(default_factory=list, description="more sbatch options, e.g. --constraint=h100")
    rdzv_port: int = Field(29500, ge=1024, le=65_535, description="the c10d rendezvous port on the first node")
    job_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,128}$",
        description="--job-name (default: trainpipe-train-<hash of run and output>)",
    )
    poll_s: float = Field(5, gt=0, le=600, description="seconds between scontrol show job polls")
    timeout_s: float = Field(
        86_400, gt=0, le=30 * 86_400, description="give up waiting (and scancel) after this long, queueing included"
    )


class TrainModelParams(StrictModel):
    """Settings of train_model that are not artifacts."""

    train_function: str = Field(
        "builtin:mlp",
        min_length=1,
        description="the training function: builtin:mlp, builtin:cnn, or your own 'package.module:function' called as "
        "f(ctx, train_config)",
    )
    train_config: dict[str, Any] = Field(
        default_factory=dict,
        description="passed to the training function (the built-ins take hidden_units, learning_rate, momentum, ...)",
    )
    task: Task = Field(
        "classification", description="what the label is: classes (classification) or numbers (regression)"
    )
    label_column: str = Field("label", min_length=1, description="name of the label column")
    backend: BackendName = Field(
        "torch_ddp",
        description="how the ranks train: " + "; ".join(f"{b.name}: {b.summary}" for b in BACKENDS.values()),
    )
    horovod_binding: Literal["torch", "tensorflow"] = Field(
        "torch", description="Horovod framework binding; only torch builds against this stack"
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="bf16 runs on CPU and GPU; fp16 needs CUDA")
    nproc_per_node: int = Field(2, ge=1, le=256, description="processes (ranks) on this node")
    nnodes: int = Field(
        1, ge=1, le=4096, description="nodes in the job; > 1 needs rdzv_endpoint (or MASTER_ADDR/MASTER_PORT)"
    )
    node_rank: int | None = Field(
        None, ge=0, description="this node's rank (default: NODE_RANK / PET_NODE_RANK / RANK from the environment)"
    )
    rdzv_endpoint: str | None = Field(None, description="host:port of the rendezvous (multi-node)")
    cluster: ClusterJob | None = Field(
        None, description="run a multi-node job (nnodes > 1) through the Kubeflow Trainer"
    )
    slurm: SlurmJob | None = Field(
        None, description="run the training as a Slurm job (sbatch, srun); from Airflow or the CLI"
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks cuda when present")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on cuda, gloo on cpu")
    epochs: int = Field(10, ge=1, le=100_000, description="passes over the training rows")
    max_steps: int | None = Field(
        None, ge=1, le=10**9, description="stop after this many optimizer steps (a short profiling pass)"
    )
    batch_size: int = Field(64, ge=1, le=10_000_000, description="global batch size, split evenly across all ranks")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share, the same split evaluate_model uses")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="seeds the split, the initial weights and the batch order")
    max_cost: float | None = Field(
        None,
        gt=0,
        le=1e9,
        description="stop once the training has cost this much at its hardware profile's prices (over every attempt: "
        "the checkpoints keep the count), with a checkpoint, exit 9; a rerun with a larger max_cost resumes",
    )
    max_gpu_hours: float | None = Field(
        None,
        gt=0,
        le=1e7,
        description="stop once the training has held this many GPU-hours (over every attempt), as max_cost does",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        le=100,
        description="restarts of the whole worker group after a failure; each resumes from the newest checkpoint",
    )
    collective_timeout_s: int = Field(
        300, ge=10, le=86_400, description="bound on a hung collective: never an endless wait"
    )
    device_data_share: float = Field(
        0.25,
        ge=0,
        le=0.9,
        description="on a GPU, in-memory training rows move to the device when they take at most this share of its "
        "free memory "
        "(batches are then gathered there); otherwise each batch is copied ahead from pinned host memory; 0: always "
        "from the host",
    )
    profile_steps: int = Field(
        0,
        ge=0,
        le=10_000,
        description="trace this many steps with torch.profiler on rank 0 (after 4 warm-up steps); 0: off",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65_535,
        description="serve each rank's Prometheus metrics on this port + its local rank while it trains; "
        "0: off (on a KFP face 0 is unset: turn it off in the profile); default: the hardware profile's",
    )
    checkpoint_every_s: float = Field(
        300,
        ge=0,
        le=30 * 86_400,
        description="checkpoint once this many seconds passed since the last (at the next step's end, an epoch's end "
        "included); "
        "the last step, and a preemption (SIGTERM, SIGUSR1), always checkpoint; 0: not by time",
    )
    checkpoint_every_steps: int = Field(
        0, ge=0, le=10**9, description="also checkpoint every N optimizer steps (0: not by count)"
    )
    keep_checkpoints: int = Field(2, ge=1, le=1000, description="the newest checkpoints kept; older ones are deleted")
    serving_requirements: list[str] = Field(
        default_factory=list,
        description="extra pip requirements of the registered model (your model code's own dependencies)",
    )
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    experiment_name: str = Field("trainpipe", min_length=1, description="the MLflow experiment of the run")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @model_validator(mode="after")
    def _check(self) -> TrainModelParams:
        if self.batch_size % self.world_size:
            raise ValueError(
                f"batch_size: {self.batch_size} must be divisible by the world size {self.world_size} (nproc_per_node "
                "x nnodes)"
            )
        if self.slurm is not None and self.cluster is not None:
            raise ValueError("slurm: set either slurm or cluster (Kubernetes), not both")
        if self.dist_backend == "nccl" and self.device == "cpu":
            raise ValueError("dist_backend: nccl needs device cuda")
        if self.train_function.startswith("builtin:"):
            if self.train_function.split(":", 1)[1] not in BUILTIN_FUNCTIONS:
                raise ValueError(
                    f"train_function: unknown built-in {self.train_function!r} (built in: "
                    f"{', '.join('builtin:' + f for f in BUILTIN_FUNCTIONS)})"
                )
        elif not _is_entry_point(self.train_function):
            raise ValueError(
                f"train_function: {self.train_function!r} is neither builtin:mlp, builtin:cnn nor "
                "'package.module:function'"
            )
        _check_train_config(self.train_function, self.train_config)
        if self.backend == "horovod" and self.horovod_binding == "tensorflow":
            raise ValueError(
                "horovod_binding: tensorflow is not available: Horovod 0.28.1's TensorFlow ops do not build against "
                "TensorFlow 2.21; use backend tensorflow (MultiWorkerMirroredStrategy) or horovod with the torch "
                "binding"
            )
        if self.nnodes > 1 and not BACKENDS[self.backend].multi_node:
            several = ", ".join(b.name for b in BACKENDS.values() if b.multi_node)
            raise ValueError(
                f"nnodes: multi-node {self.backend} runs under an MPIJob or horovodrun with hosts; use {several} for "
                "nnodes > 1"
            )
        return self


def _check_train_config(function: str, train_config: dict[str, Any]) -> None:
    """The config against the model the function declares (ValueError, one line, naming each key)."""
    from trainpipe.contract.errors import InputError
    from trainpipe.training import config_types

    try:
        config_types.check(function, train_config)
    except InputError as exc:
        raise ValueError(str(exc)) from None


def _is_entry_point(value: str) -> bool:
    module, sep, func = value.partition(":")
    return (
        bool(sep)
        and all(p.isidentifier() for p in module.split("."))
        and all(p.isidentifier() for p in func.split("."))
    )


class TrainModelConfig(TrainModelParams):
    """Everything train_model needs, artifacts included."""

    data: str = Field(
        ..., min_length=1, description="the dataset snapshot (snapshot_dataset's output)", json_schema_extra=SOURCE
    )
    output_dir: str = Field(
        ..., min_length=1, description="where the model, checkpoints and telemetry go", json_schema_extra=OUTPUT
    )
    checkpoint_dir: str | None = Field(
        None, description="checkpoints (default: <output_dir>/checkpoints); a rerun resumes from it"
    )
    tuned: str | None = Field(
        None,
        description="tune_model's output: its best trial's settings override these (lineage records the study)",
        json_schema_extra=settings_input(TUNED_SETTINGS_FILE, made_by="tune_model"),  # laid over these, then checked
    )

    @property
    def checkpoint_folder(self) -> Path:
        """Where the checkpoints are (and what every attempt spent, and the training's MLflow run): checkpoint_dir,
        else ``<output_dir>/checkpoints``."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.output_dir) / CHECKPOINT_DIR
