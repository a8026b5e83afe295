"""The training backends, in one table: the settings' choices, ``--help``, the launcher, the rank's
strategy and the docs all read it. Framework-free: a rank imports its strategy class by name.

Adding a backend is one row here, its strategy class, and (when its ranks start differently from
the existing ones) a plan in :data:`trainpipe.training.launch.LAUNCHERS`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trainpipe.contract.imports import import_module


@dataclass(frozen=True)
class Backend:
    """One way to run a training function's ranks.

    Attributes:
        name: The ``backend`` setting's value.
        framework: ``torch`` or ``tensorflow``: which context a rank makes and which built-ins it runs.
        module: What must be importable for it (checked before any rank starts).
        install: How to get ``module`` when it is missing.
        launcher: How this node's ranks start (a key of ``trainpipe.training.launch.LAUNCHERS``).
        strategy: ``module:Class`` of the strategy a rank runs with (communication, wrapping).
        multi_node: Whether it runs across nodes (``nnodes > 1``).
        summary: One line for ``--help`` and the docs.
    """

    name: str
    framework: Literal["torch", "tensorflow"]
    module: str
    install: str
    launcher: str
    strategy: str
    multi_node: bool
    summary: str

    def strategy_class(self) -> Any:
        """The strategy class (imports its framework)."""
        module, _, cls = self.strategy.partition(":")
        return getattr(import_module(module), cls)


_TORCH = "pip install 'trainpipe[torch]'"

BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "torch_ddp",
            "torch",
            "torch",
            _TORCH,
            "torch",
            "trainpipe.training.torch.strategies:DDPStrategy",
            True,
            "PyTorch DistributedDataParallel under torchrun (gloo on CPU, NCCL on GPU)",
        ),
        Backend(
            "torch_fsdp",
            "torch",
            "torch",
            _TORCH,
            "torch",
            "trainpipe.training.torch.strategies:FSDPStrategy",
            True,
            "PyTorch FSDP2 (fully_shard) under torchrun: parameters, gradients and optimizer state sharded",
        ),
        Backend(
            "horovod",
            "torch",
            "horovod",
            "make horovod (builds Horovod 0.28.1 with C++17 into a wheel cache)",
            "horovod",
            "trainpipe.training.torch.strategies:HorovodStrategy",
            False,
            "Horovod's PyTorch binding under horovodrun --gloo (one node)",
        ),
        Backend(
            "tensorflow",
            "tensorflow",
            "tensorflow",
            "pip install 'trainpipe[tensorflow]'",
            "tensorflow",
            "trainpipe.training.tf.strategy:TFStrategy",
            True,
            "TensorFlow MultiWorkerMirroredStrategy (MirroredStrategy on one worker), a custom training loop",
        ),
    )
}

#: The ``backend`` setting's type: one of the table's names (built from the table, so the checker reads a str).
if TYPE_CHECKING:
    BackendName = str
else:
    BackendName = Literal[tuple(BACKENDS)]


def uses_cuda(device: str) -> bool:
    """Whether ranks given the ``device`` setting train on GPUs (what ``auto`` picks), without importing torch."""
    if device != "auto":
        return device == "cuda"
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())
