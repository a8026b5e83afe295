"""Baseline: teampkg.tiny's training as a bare loop in one process: the same rows, split, row order and
seed as train_model gives the function, the same ops (a linear layer, cross entropy, SGD, the loss kept as
a tensor each step as ctx.log keeps it), and nothing else.

python bare_tiny.py DATA.csv LABEL EPOCHS BATCH SEED
Prints one JSON line: samples/s, the median step time (step end to step end, the batch's gathering
included, as train_model's step records are), wall seconds.
"""

import json
import sys
import time

import numpy as np
import torch
from _data import load_raw, shard, step_figures


def main() -> None:
    path, label, epochs, batch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    t0 = time.perf_counter()
    np.random.seed(seed)
    torch.manual_seed(seed)
    x, y, n_classes = load_raw(path, label, seed)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    model = torch.nn.Linear(xs.shape[1], n_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept, ends, t_loop = [], [], time.perf_counter()
    for epoch in range(epochs):
        for idx in torch.from_numpy(shard(len(xs), batch, seed, epoch, 0, 1)):
            loss = torch.nn.functional.cross_entropy(model(xs[idx].float()), ys[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            kept.append(loss.detach())
            ends.append(time.perf_counter() - t_loop)
    print(json.dumps({**step_figures(ends, batch), "wall_s": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
