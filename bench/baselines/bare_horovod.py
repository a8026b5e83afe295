"""Baseline: a bare Horovod (PyTorch) loop, the same model, data, seed and sharding as train_model's
horovod backend. horovodrun --gloo -np N python bare_horovod.py DATA.csv LABEL EPOCHS BATCH LR SEED HIDDEN
"""

import json
import sys
import time

import horovod.torch as hvd
import torch
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
        int(sys.argv[7]),
    )
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    x, y, n_classes = load(path, label, seed)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(xs.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = nn.CrossEntropyLoss()
    ends, t_loop = [], time.perf_counter()
    for epoch in range(epochs):
        sums = torch.zeros(2, dtype=torch.float64)
        for idx in torch.from_numpy(shard(len(xs), batch, seed, epoch, rank, world)):
            opt.zero_grad()
            loss = loss_fn(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
            sums += torch.tensor([loss.item() * len(idx), len(idx)], dtype=torch.float64)
            ends.append(time.perf_counter() - t_loop)
        sums = hvd.allreduce(sums, op=hvd.Sum)
        final_loss = float(sums[0] / sums[1])
    if rank == 0:
        print(json.dumps({**step_figures(ends, batch), "final_loss": final_loss}))


if __name__ == "__main__":
    main()
