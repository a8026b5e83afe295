"""What a training run checks and sets before any rank starts, framework-free: the backend is
installed, the devices asked for exist, the training function can be found and its built-in
settings are valid, the data is there; and the ranks' environment (threads per rank). train_model
and profile_training's own pass both call it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess

from trainpipe.contract.errors import InputError
from trainpipe.contract.resources import threads_per_rank
from trainpipe.data.tabular import find_dataset
from trainpipe.training import builtin
from trainpipe.training.backends import BACKENDS
from trainpipe.training.settings import TrainModelConfig


def check_inputs(config: TrainModelConfig) -> None:
    """Fail fast, in one line, before any rank starts, on what needs no framework to check.

    The data and the training function itself are checked by the ranks (reading the data and
    importing the function import the framework); their errors stop the group at once.
    """
    check_settings(config)
    find_dataset(config.data, "data")


def check_settings(config: TrainModelConfig) -> None:
    """What :func:`check_inputs` checks but the data: the backend is installed, the devices asked for exist,
    the training function's package can be found and a built-in's settings are valid."""
    backend = BACKENDS[config.backend]
    if importlib.util.find_spec(backend.module) is None:
        raise InputError(
            f"backend: {config.backend} needs {backend.module}, which is not installed ({backend.install})"
        )
    wants_cuda = config.device == "cuda" or config.dist_backend == "nccl"
    gpus = cuda_device_count() if (wants_cuda or config.precision == "fp16" or config.device == "auto") else 0
    if wants_cuda and gpus == 0:
        raise InputError("device: cuda requested but no CUDA device is visible")
    if config.precision == "fp16" and (gpus == 0 or config.device == "cpu"):
        raise InputError("precision: fp16 needs a CUDA device (use bf16 on CPU)")
    uses_gpus = gpus > 0 and config.device != "cpu"
    if uses_gpus and backend.framework == "torch" and config.nproc_per_node > gpus:
        raise InputError(
            f"nproc_per_node: {config.nproc_per_node} GPU ranks requested but only {gpus} GPUs are visible on this node"
        )
    fn = config.train_function
    if fn.startswith("builtin:"):
        builtin.parse(config.train_config, config.task)
    else:
        top = fn.partition(":")[0].split(".")[0]  # found without importing it (its import would import the framework)
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise InputError(
                f"train_function: cannot import {top!r} for {fn!r} (is its package installed or on PYTHONPATH?)"
            )


def check_function(config: TrainModelConfig) -> None:
    """The training function imported here and its settings checked, as a rank will (before a job is queued
    where this process does not train itself).

    Raises:
        InputError: it cannot be imported, cannot be called as ``f(ctx, config)``, or its config is wrong.
    """
    from trainpipe.training.functions import resolve_function

    if config.train_function.startswith("builtin:"):
        builtin.parse(config.train_config, config.task)
    else:
        resolve_function(config.train_function, BACKENDS[config.backend].framework)


def cuda_device_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def rank_env(config: TrainModelConfig) -> dict[str, str]:
    """The ranks' environment: threads per rank from the usable CPUs unless OMP_NUM_THREADS is set;
    TensorFlow's thread pools follow the same figure unless its own variables are set."""
    env = dict(os.environ)
    threads = env.get("OMP_NUM_THREADS") or str(threads_per_rank(config.nproc_per_node))
    env["OMP_NUM_THREADS"] = threads
    env.setdefault("TF_NUM_INTRAOP_THREADS", threads)
    env.setdefault("TF_NUM_INTEROP_THREADS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if BACKENDS[config.backend].framework == "tensorflow" and (config.device == "cpu" or cuda_device_count() == 0):
        env["CUDA_VISIBLE_DEVICES"] = ""  # TF would otherwise probe for CUDA and log errors on CPU hosts
    return env
