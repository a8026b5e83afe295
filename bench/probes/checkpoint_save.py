"""What a checkpoint costs the training loop: torch.distributed.checkpoint's async save (what
trainpipe's context does: the loop waits for the staging, a thread writes) against torch.save of the
same state, and both until durable (fsynced).

python checkpoint_save.py DIR REPEATS   -> one JSON line: plain, staged, synced, durable (seconds each), mb
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024))
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
m(torch.randn(8, 1024)).sum().backward()
opt.step()
d = Path(sys.argv[1])
d.mkdir(parents=True, exist_ok=True)
plain, staged, synced, durable = [], [], [], []
for i in range(int(sys.argv[2])):
    state = {"model": m.state_dict(), "optimizer": opt.state_dict()}
    t = time.perf_counter()
    torch.save(state, d / "plain.pt")
    plain.append(time.perf_counter() - t)
    t = time.perf_counter()
    with open(d / "synced.pt", "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    synced.append(time.perf_counter() - t)
    t = time.perf_counter()
    msd, osd = get_state_dict(m, opt)
    future = dcp.async_save({"model": msd, "optimizer": osd}, checkpoint_id=str(d / f"async-{i}"), no_dist=True)
    staged.append(time.perf_counter() - t)
    future.result()
    shutil.rmtree(d / f"async-{i}")
    t = time.perf_counter()
    msd, osd = get_state_dict(m, opt)
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(d / f"sync-{i}"), no_dist=True)
    durable.append(time.perf_counter() - t)
    shutil.rmtree(d / f"sync-{i}")
print(json.dumps({"plain": plain, "staged": staged, "synced": synced, "durable": durable, "mb": (d / "plain.pt").stat().st_size / 1e6}))
