"""horovod backend (PyTorch binding): one rank under ``horovodrun --gloo``.

``hvd.init``, the DistributedOptimizer (gradients averaged across ranks) and a
broadcast of rank 0's parameters and optimizer state, then the shared loop.
Imports torch and horovod.torch only.
"""

from __future__ import annotations

import os
import sys

import torch

from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.components.train_model.rank import run_rank
from trainpipe.components.train_model.torch_loop import Collectives, resolve_device, train


def body(config: TrainModelConfig) -> None:
    import horovod.torch as hvd

    hvd.init()
    os.environ["RANK"] = str(hvd.rank())
    device = resolve_device(config, hvd.local_rank())

    def wrap(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Average)

    def step(opt: torch.optim.Optimizer, scaler: object) -> None:
        if scaler is None:
            opt.step()
            return
        opt.synchronize()  # gradients reduced before the scaler unscales them
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()

    def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce(t, op=hvd.Sum, name=f"sum{t.numel()}")

    coll = Collectives(
        name="horovod-nccl" if device.type == "cuda" else "horovod-gloo",
        rank=hvd.rank(),
        world=hvd.size(),
        local_rank=hvd.local_rank(),
        all_reduce_sum=all_reduce_sum,
        barrier=lambda: hvd.allreduce(torch.zeros(1), name="barrier"),
        wrap=wrap,
        optimizer_step=step,
    )
    try:
        train(config, coll, device)
    finally:
        hvd.shutdown()


if __name__ == "__main__":
    sys.exit(run_rank(sys.argv[1], body))
