"""What a checkpoint's copy of a training state costs by hand: the weights and SGD momentum of an
MLP (64-H-...-H-10) copied into buffers made and touched beforehand, the floor any staging can
reach. On a GPU the copy goes to pinned host memory (and is waited for). Processes started
together begin together, as the ranks of a run do.

python state_copy.py HIDDEN[,HIDDEN...] START_UNIX_TIME DEVICE REPEATS -> one JSON line: s (median seconds per copy), mb
"""

import json
import statistics
import sys
import time
from itertools import pairwise

import torch

torch.set_num_threads(1)
hidden, start, device, repeats = (
    [int(h) for h in sys.argv[1].split(",")],
    float(sys.argv[2]),
    torch.device(sys.argv[3]),
    int(sys.argv[4]),
)
cuda = device.type == "cuda"
widths = [64, *hidden, 10]
state = []
for a, b in pairwise(widths):
    layer = torch.nn.Linear(a, b, device=device)
    state += [
        layer.weight.detach(),
        layer.bias.detach(),
        torch.zeros_like(layer.weight),
        torch.zeros_like(layer.bias),
    ]  # + momentum
buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda).zero_() for t in state]
while time.time() < start:
    time.sleep(0.005)
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    for buf, t in zip(buffers, state, strict=True):
        buf.copy_(t, non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize(device)
    times.append(time.perf_counter() - t0)
print(json.dumps({"s": statistics.median(times), "mb": sum(t.numel() * t.element_size() for t in state) / 1e6}))
