"""torch_ddp backend: one rank under torchrun.

``python -m trainpipe.components.train_model.torch_ddp CONFIG`` is what torchrun starts
on every node (single node: ``--standalone``; multi node: c10d rendezvous). NCCL on
CUDA, gloo otherwise (overridable); the collective timeout bounds any hang.
Imports torch only.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.components.train_model.rank import run_rank
from trainpipe.components.train_model.torch_loop import Collectives, resolve_device, train


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    # gloo reduces CPU tensors; NCCL needs them on the rank's GPU.
    if dist.get_backend() == "nccl":
        moved = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(moved)
        return moved.cpu()
    dist.all_reduce(t)
    return t


def _attempt_store(rank: int, timeout: timedelta) -> dist.Store:
    """The rendezvous store, under a prefix of its own for each restart of the group.

    Without it a restarted rank can read the address a dead peer published in the
    previous attempt and fail (or hang until the timeout) connecting to it.
    """
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=not agent_hosts and rank == 0,
        timeout=timeout,
        wait_for_workers=False,
    )
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    return dist.PrefixStore(f"trainpipe/{run_id}/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)


def body(config: TrainModelConfig) -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(config, local_rank)
    backend = config.dist_backend if config.dist_backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    timeout = timedelta(seconds=config.collective_timeout_s)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend, store=_attempt_store(rank, timeout), rank=rank, world_size=world, timeout=timeout)
    try:

        def wrap(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
            return DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None), opt

        coll = Collectives(
            name=backend,
            rank=dist.get_rank(),
            world=dist.get_world_size(),
            local_rank=local_rank,
            all_reduce_sum=_all_reduce_sum,
            barrier=dist.barrier,
            wrap=wrap,
        )
        train(config, coll, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(run_rank(sys.argv[1], body))
