"""Baseline: a strong hand-written GPU loop, the one trainpipe's GPU figures are held to. Every
training row lives on the GPU, each batch is gathered there (index_select, in the same seeded order
as train_model), nothing inside the loop synchronizes the device (the loss is summed on the device
and read once at the end; step ends are CUDA events read afterwards), the same MLP, SGD with
momentum and autocast precision as builtin:mlp. One process, one GPU.

python bare_gpu.py DATA.csv LABEL EPOCHS BATCH LR SEED HIDDEN[,HIDDEN…] PRECISION
Prints one JSON line: samples_per_second (from step 5's end to the last step's), median_step_s,
flops_per_sample (training: 3 × the forward's multiply-adds × 2, as profile_training counts),
achieved_tflops, device_name, final_loss.
"""

import json
import statistics
import sys
import time
from itertools import pairwise

import torch
import torch.nn as nn
from _data import load, shard


def main() -> None:
    path, label, epochs, batch, lr, seed = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        float(sys.argv[5]),
        int(sys.argv[6]),
    )
    hidden, precision = [int(h) for h in sys.argv[7].split(",")], sys.argv[8]
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    x, y, n_classes = load(path, label, seed)
    xs, ys = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    torch.manual_seed(seed)
    layers, width = [], xs.shape[1]
    widths = [width, *hidden, n_classes]
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    model = nn.Sequential(*layers, nn.Linear(width, n_classes)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    amp = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    ends = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        order = torch.from_numpy(shard(len(x), batch, seed, epoch, 0, 1)).pin_memory().to(device, non_blocking=True)
        for idx in order:
            xb, yb = xs.index_select(0, idx), ys.index_select(0, idx)
            with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
                out = model(xb)
            loss = nn.functional.cross_entropy(out.float(), yb)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            ends.append(end)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    steps = [a.elapsed_time(b) / 1000.0 for a, b in pairwise(ends)]
    window = sum(steps[4:])  # from step 5's end to the last step's
    sps = batch * (len(ends) - 5) / window
    fps = 3.0 * sum(2 * a * b for a, b in pairwise(widths))
    print(
        json.dumps(
            {
                "samples_per_second": sps,
                "median_step_s": statistics.median(steps),
                "flops_per_sample": fps,
                "achieved_tflops": fps * sps / 1e12,
                "device_name": torch.cuda.get_device_name(device),
                "final_loss": float(loss_sum) / len(ends),
                "wall_s": wall,
            }
        )
    )


if __name__ == "__main__":
    main()
