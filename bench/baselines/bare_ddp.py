"""Baseline: a bare hand-written torch DDP loop (torchrun), the same model, data, seed and global
batch sharding as train_model, with no checkpoints, telemetry or tracking.

torchrun --standalone --nproc_per_node N bare_ddp.py DATA.csv LABEL EPOCHS BATCH LR SEED HIDDEN
Prints one JSON line from rank 0: samples/s from the end of step 5 to the last step, the final
epoch's mean loss, wall seconds.
"""

import json
import sys
import time

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    path, label, epochs, batch, lr, seed, hidden = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    t0 = time.perf_counter()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    df = pd.read_csv(path)
    y_raw = df.pop(label).to_numpy()
    x = df.to_numpy(dtype=np.float32)
    classes, y = np.unique(y_raw, return_inverse=True)
    n = len(df)
    perm = np.random.default_rng(seed).permutation(n)  # the same held-out split as trainpipe.tabular
    n_test = max(1, int(round(n * 0.2)))
    train_idx = np.sort(perm[n_test:])
    xt = x[train_idx]
    mean, std = xt.mean(axis=0), xt.std(axis=0)
    std[std == 0] = 1.0
    xs = torch.from_numpy(((xt - mean) / std).astype(np.float32))
    ys = torch.from_numpy(y[train_idx].astype(np.int64))
    torch.manual_seed(seed)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(xs.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, len(classes))))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    steps = len(xs) // batch
    local = batch // world
    ends, t_loop = [], time.perf_counter()
    for epoch in range(epochs):
        order = np.random.default_rng(seed + epoch).permutation(len(xs))[: steps * batch].reshape(steps, world, local)[:, rank, :]
        sums = torch.zeros(2, dtype=torch.float64)
        for idx in torch.from_numpy(order):
            opt.zero_grad()
            loss = loss_fn(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
            sums += torch.tensor([loss.item() * len(idx), len(idx)], dtype=torch.float64)
            ends.append(time.perf_counter() - t_loop)
        dist.all_reduce(sums)
        final_loss = float(sums[0] / sums[1])
    sps = batch * (len(ends) - 5) / (ends[-1] - ends[4])  # from the end of step 5, as trainpipe's figure
    if rank == 0:
        print(json.dumps({"samples_per_second": sps, "final_loss": final_loss, "wall_s": time.perf_counter() - t0}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
