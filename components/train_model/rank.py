"""Framework-free pieces every backend's ranks share: restart attempt, fault injection,
where checkpoints live, model.json, and how a rank reports a user error.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainpipe.components.train_model.spec import CHECKPOINT_DIR, TrainModelConfig
from trainpipe.contract.errors import InputError, TrainpipeError
from trainpipe.contract.io import atomic_write_json

FAULT_ENV = "TRAINPIPE_FAULT"


def attempt() -> int:
    """Which restart of the worker group this is (0 for the first run)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("TRAINPIPE_ATTEMPT") or 0)


@dataclass
class Fault:
    """A fault to inject, from ``TRAINPIPE_FAULT`` (tests only; honoured on the first attempt).

    ``kill:RANK:STEP`` SIGKILLs rank RANK before global step STEP;
    ``kill_checkpoint:STEP`` SIGKILLs rank 0 half way through writing checkpoint STEP.
    """

    kind: str = ""
    rank: int = -1
    step: int = -1

    @classmethod
    def from_env(cls) -> "Fault":
        raw = os.environ.get(FAULT_ENV, "")
        if not raw or attempt() > 0:
            return cls()
        parts = raw.split(":")
        if parts[0] == "kill" and len(parts) == 3:
            return cls("kill", int(parts[1]), int(parts[2]))
        if parts[0] == "kill_checkpoint" and len(parts) == 2:
            return cls("kill_checkpoint", 0, int(parts[1]))
        raise InputError(f"{FAULT_ENV}: {raw!r} is not kill:RANK:STEP or kill_checkpoint:STEP")

    def maybe_kill(self, kind: str, rank: int, step: int) -> None:
        if self.kind == kind and self.rank == rank and self.step == step:
            print(f"train_model rank {rank}: injected fault {kind} at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_dir(config: TrainModelConfig) -> Path:
    return Path(config.checkpoint_dir) if config.checkpoint_dir else Path(config.output_dir) / CHECKPOINT_DIR


def model_meta(
    data: dict[str, Any], config: TrainModelConfig, device: str, dist_backend: str, world: int,
    resumed_from: int, global_step: int, wall: float,
) -> dict[str, Any]:
    """model.json: everything a later step needs to rebuild and use the model."""
    return {
        "arch": config.model,
        "framework": "torch",
        "trained_with": config.backend,
        "input_dim": len(data["feature_columns"]),
        "input_shape": data["input_shape"],
        "hidden_units": config.hidden_units,
        "model_kwargs": config.model_kwargs,
        "classes": data["classes"],
        "feature_columns": data["feature_columns"],
        "label_column": config.label_column,
        "mean": data["mean"],
        "std": data["std"],
        "split": {"test_fraction": config.test_fraction, "seed": config.seed},
        "task": "classification",
        "precision": config.precision,
        "resumed_from_step": resumed_from,
        "global_steps": global_step,
        "dist_backend": dist_backend,
        "device": device,
        "world_size": world,
        "wall_s": wall,
    }


def weights_digest(state: dict[str, Any]) -> str:
    """sha256 over a state dict's names and float32 bytes: equal digests mean equal weights."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(np.ascontiguousarray(np.asarray(state[name], dtype=np.float32)).tobytes())
    return h.hexdigest()


def run_rank(config_path: str, body: Callable[[TrainModelConfig], None]) -> int:
    """Run one rank; a trainpipe error is recorded in ``.errors/rank<N>.json`` for the launcher."""
    config = TrainModelConfig.model_validate_json(Path(config_path).read_text(encoding="utf-8"))
    try:
        body(config)
    except TrainpipeError as exc:
        rank = os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0"))
        atomic_write_json(Path(config.output_dir) / ".errors" / f"rank{rank}.json", {"type": type(exc).__name__, "message": str(exc)})
        print(f"train_model rank {rank}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
