"""Baseline: a bare hand-written torch DDP loop (torchrun), the same model, data, seed and global
batch sharding as train_model, with no checkpoints, telemetry or tracking.

torchrun --standalone --nproc_per_node N bare_ddp.py DATA.csv LABEL EPOCHS BATCH LR SEED HIDDEN[,HIDDEN…]
Prints one JSON line from rank 0: samples/s from the end of step 5 to the last step, the final
epoch's mean loss, wall seconds. BARE_DEVICE=cuda runs each rank on its local GPU with NCCL (the
batches are copied from host memory each step, as train_model does).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from _data import load, shard, step_figures


def main() -> None:
    path, label, epochs, batch, lr, seed, hidden = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        float(sys.argv[5]),
        int(sys.argv[6]),
        [int(h) for h in sys.argv[7].split(",")],
    )
    t0 = time.perf_counter()
    cuda = os.environ.get("BARE_DEVICE", "cpu") == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, n_classes = load(path, label, seed)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    torch.manual_seed(seed)
    layers, width = [], xs.shape[1]
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(*layers, nn.Linear(width, n_classes)).to(device), device_ids=[device.index] if cuda else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    ends, t_loop = [], time.perf_counter()
    for epoch in range(epochs):
        order = shard(len(xs), batch, seed, epoch, rank, world)
        sums = torch.zeros(2, dtype=torch.float64)
        for idx in torch.from_numpy(order):
            opt.zero_grad()
            xb, yb = (
                (xs[idx].to(device, non_blocking=True), ys[idx].to(device, non_blocking=True))
                if cuda
                else (xs[idx], ys[idx])
            )
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            sums += torch.tensor([loss.item() * len(idx), len(idx)], dtype=torch.float64)
            ends.append(time.perf_counter() - t_loop)
        if cuda:  # NCCL reduces device tensors
            on_device = sums.to(device)
            dist.all_reduce(on_device)
            sums = on_device.cpu()
        else:
            dist.all_reduce(sums)
        final_loss = float(sums[0] / sums[1])
    if rank == 0:
        print(json.dumps({**step_figures(ends, batch), "final_loss": final_loss, "wall_s": time.perf_counter() - t0}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
