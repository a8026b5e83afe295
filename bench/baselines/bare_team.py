"""Baseline: the team's training (tests/fixtures/teampkg: SeqConvNet, its smoothed loss, AdamW, a
StepLR, its accuracy metric) written as a bare torchrun script, with the same data, split, row order and seed as
train_model gives the team's function, and no checkpoints, telemetry or tracking.

torchrun --standalone --nproc_per_node N bare_team.py DATA.csv LABEL EPOCHS BATCH SEED
Prints one JSON line from rank 0: samples/s from the end of step 5 to the last step, the median
step time, the final epoch's mean loss, wall seconds, and the clock time of the first and the last
step's end (to split a process's wall into before, in and after the loop).
"""

import json
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from _data import load_raw, shard, step_figures
from teampkg.models import SeqConvNet, smoothed_cross_entropy


def main() -> None:
    path, label, epochs, batch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    t0 = time.perf_counter()
    np.random.seed(seed)
    torch.manual_seed(seed)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, n_classes = load_raw(path, label, seed)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    net = {"width": 32, "n_classes": n_classes, "dropout": 0.1}
    model = torch.nn.parallel.DistributedDataParallel(SeqConvNet(**net))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=15, gamma=0.8)
    ends, t_loop = [], time.perf_counter()
    for epoch in range(epochs):
        sums = torch.zeros(3, dtype=torch.float64)
        for idx in torch.from_numpy(shard(len(xs), batch, seed, epoch, rank, world)):
            logits = model(xs[idx])
            loss = smoothed_cross_entropy(logits.float(), ys[idx], 0.1)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            accuracy = (logits.argmax(1) == ys[idx]).float().mean()  # the metric the team's function logs
            sums += torch.tensor([loss.item(), accuracy.item(), 1.0], dtype=torch.float64)
            ends.append(time.perf_counter() - t_loop)
            if len(ends) == 1:
                first_step_unix = time.time()
        dist.all_reduce(sums)
        final_loss = float(sums[0] / sums[2])
    if rank == 0:
        print(
            json.dumps(
                {
                    **step_figures(ends, batch),
                    "final_loss": final_loss,
                    "wall_s": time.perf_counter() - t0,
                    "first_step_unix": first_step_unix,
                    "last_step_unix": time.time() - (time.perf_counter() - t_loop - ends[-1]),
                }
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
