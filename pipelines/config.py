"""The reference pipeline's config: one YAML file drives KFP, Airflow and the CLI.

Relative paths resolve against the config file's folder; everything local
(DVC workspace and remote, MLflow database, run outputs) defaults to a place
under ``workspace``, the embedded default for a laptop or a CPU server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from trainpipe.contract.config import StrictModel, build, load_file
from trainpipe.contract.policy import Policy


class TrainSettings(StrictModel):
    """The training settings a pipeline exposes (see train_model for all)."""

    backend: Literal["torch_ddp", "tensorflow", "horovod"] = "torch_ddp"
    model: str = Field("mlp", min_length=1, description="mlp, cnn or 'package.module:function'")
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    nproc_per_node: int = Field(2, ge=1, le=256)
    device: str = "auto"
    epochs: int = Field(10, ge=1, le=100_000)
    batch_size: int = Field(64, ge=1, le=10_000_000)
    learning_rate: float = Field(0.05, gt=0, le=10)
    hidden_units: list[int] = Field(default_factory=lambda: [64])
    test_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(0, ge=0)
    max_restarts: int = Field(3, ge=0, le=100)
    checkpoint_every_steps: int = Field(50, ge=0)


class PipelineConfig(StrictModel):
    """Settings of the reference training pipeline."""

    data: str = Field(..., min_length=1, description="the raw dataset: a .csv or .parquet file")
    label_column: str = Field("label", min_length=1)
    workspace: str = Field(".trainpipe", description="local state: DVC workspace and remote, MLflow DB, run outputs")
    suite: str = "builtin:default"
    dataset_name: str = Field("dataset", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    dvc_repo_dir: str | None = None
    dvc_remote_url: str | None = None
    tracking_uri: str | None = None
    experiment_name: str = "trainpipe"
    model_name: str = Field("trainpipe-model", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")
    alias: str = "champion"
    thresholds: dict[str, float] = Field(default_factory=lambda: {"accuracy": 0.8})
    train: TrainSettings = Field(default_factory=TrainSettings)
    profile: str = "cpu"
    policy: Policy | None = Field(
        None, description="data residency, TLS, encryption and audit rules (default: TRAINPIPE_POLICY); every step gets it"
    )
    schedule: str | None = Field(
        "@daily", min_length=1, description="the training DAG's schedule: a cron expression or preset; null for triggered runs only"
    )

    def resolved(self, base: Path | None = None) -> "PipelineConfig":
        """A copy with every local path absolute and every default filled in."""
        base = base or Path.cwd()

        def absolute(p: str) -> str:
            return p if "://" in p or p.startswith("builtin:") else str((base / p).resolve())

        ws = Path(absolute(self.workspace))
        tracking = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ws / 'mlflow.db'}"
        return self.model_copy(
            update={
                "data": absolute(self.data),
                "workspace": str(ws),
                "suite": absolute(self.suite),
                "dvc_repo_dir": absolute(self.dvc_repo_dir) if self.dvc_repo_dir else str(ws / "dvc-repo"),
                "dvc_remote_url": absolute(self.dvc_remote_url) if self.dvc_remote_url else str(ws / "dvc-remote"),
                "tracking_uri": tracking,
            }
        )

    def effective_policy(self) -> Policy:
        """The config's policy, else the one in force (``TRAINPIPE_POLICY``)."""
        from trainpipe.contract.policy import load_policy

        return self.policy if self.policy is not None else load_policy()

    def check_policy(self) -> Policy:
        """What can be known before anything runs: the DVC remote, the tracking server, the workspace.

        Each step checks again at run time against what it is about to touch.

        Raises:
            InputError: a location, region, endpoint or missing encryption the policy refuses.
        """
        from trainpipe.components.snapshot_dataset.core import REMOTE_SCHEMES
        from trainpipe.contract import policy as p

        policy = self.effective_policy()
        if self.tracking_uri:
            p.check_endpoint("tracking_uri", self.tracking_uri, policy)
        if self.dvc_remote_url:
            p.check_scheme("dvc_remote_url", self.dvc_remote_url, REMOTE_SCHEMES)
            p.check_store("dvc_remote_url", self.dvc_remote_url, policy.sse, policy=policy)
        p.check_location("workspace", self.workspace, p.env_region(), policy)
        return policy

    def pipeline_arguments(self) -> dict[str, Any]:
        """The KFP pipeline's parameters for this config (resolve first)."""
        t = self.train
        return {
            "raw_data_uri": self.data,
            "label_column": self.label_column,
            "suite": self.suite,
            "dvc_repo_dir": self.dvc_repo_dir,
            "dvc_remote_url": self.dvc_remote_url,
            "dataset_name": self.dataset_name,
            "tracking_uri": self.tracking_uri,
            "experiment_name": self.experiment_name,
            "model_name": self.model_name,
            "alias": self.alias,
            "thresholds": self.thresholds,
            "backend": t.backend,
            "model_arch": t.model,
            "precision": t.precision,
            "nproc_per_node": t.nproc_per_node,
            "device": t.device,
            "epochs": t.epochs,
            "batch_size": t.batch_size,
            "learning_rate": t.learning_rate,
            "hidden_units": t.hidden_units,
            "test_fraction": t.test_fraction,
            "seed": t.seed,
            "max_restarts": t.max_restarts,
            "checkpoint_every_steps": t.checkpoint_every_steps,
        }


def load_pipeline_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> PipelineConfig:
    """Load and resolve a pipeline config file (relative paths against its folder).

    Raises:
        InputError: one line naming every bad field.
    """
    data: dict[str, Any] = load_file(path) if path else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    base = Path(path).resolve().parent if path else Path.cwd()
    return build(PipelineConfig, data, where="pipeline config").resolved(base)
