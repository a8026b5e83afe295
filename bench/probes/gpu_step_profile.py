"""Where a step's host work goes on a GPU: torch.profiler over a window of a bare loop's steps (bare_gpu.py's
loop: rows on the device, no sync) beside train_model's own window of the same shape (its telemetry's
``profiler.top_ops``, from ``--profile-steps``), per step. Issue 56's narrow shape spends ~0.34 ms a step that
the bare loop does not: the ops only trainpipe's side has, and the ones it calls more often, show it.

python gpu_step_profile.py DATA.csv HIDDEN[,HIDDEN…] BATCH STEPS RANK0_TELEMETRY.json
Prints a markdown table (the top ops by self CPU time per step, both sides) and one JSON line.
"""

import json
import sys

import torch
import torch.nn as nn
from _data import load, shard
from torch.profiler import ProfilerActivity, profile, schedule


def bare_window(path: str, hidden: list[int], batch: int, steps: int) -> dict[str, dict[str, float]]:
    device = torch.device("cuda", 0)
    x, y, n_classes = load(path, "label", 0)
    xs, ys = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    torch.manual_seed(0)
    layers, width = [], xs.shape[1]
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    model = nn.Sequential(*layers, nn.Linear(width, n_classes)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    order = torch.from_numpy(shard(len(x), batch, 0, 0, 0, 1)).to(device)
    prof = profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=3, warmup=1, active=steps, repeat=1),
    )
    prof.start()
    for i, idx in enumerate(order):
        if i >= 4 + steps:
            break
        xb, yb = xs.index_select(0, idx), ys.index_select(0, idx)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(xb)
        loss = nn.functional.cross_entropy(out.float(), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_sum += loss.detach()
        prof.step()
    torch.cuda.synchronize()
    prof.stop()
    return {
        e.key: {
            "self_cpu_us": e.self_cpu_time_total / steps,
            "self_device_us": float(getattr(e, "self_device_time_total", 0.0) or 0.0) / steps,
            "calls": e.count / steps,
        }
        for e in prof.key_averages()
    }


def main() -> None:
    path, hidden, batch, steps, tele = (
        sys.argv[1],
        [int(h) for h in sys.argv[2].split(",")],
        *map(int, sys.argv[3:5]),
        sys.argv[5],
    )
    bare = bare_window(path, hidden, batch, steps)
    prof = json.load(open(tele))["profiler"] or {}
    ours_steps = prof.get("steps") or 1
    ours = {
        o["name"]: {
            "self_cpu_us": 1000 * o["self_cpu_ms"] / ours_steps,
            "self_device_us": 1000 * o.get("self_device_ms", 0.0) / ours_steps,
            "calls": o["calls"] / ours_steps,
        }
        for o in prof.get("top_ops", [])
    }
    names = sorted(
        set(ours) | set(sorted(bare, key=lambda k: -bare[k]["self_cpu_us"])[:15]),
        key=lambda k: -max(ours.get(k, {}).get("self_cpu_us", 0), bare.get(k, {}).get("self_cpu_us", 0)),
    )
    shape = f"MLP 64-{'-'.join(map(str, hidden))}-10, batch {batch}, bf16"
    print(f"Top host-side ops per step, {shape} ({steps}-step windows; train_model's profile keeps its top 15)\n")
    cols = ["op", "bare calls", "bare self CPU µs", "ours calls", "ours self CPU µs", "ours self device µs"]
    print("| " + " | ".join(cols) + " |")
    print("|---" * len(cols) + "|")
    for k in names:
        b, o = bare.get(k), ours.get(k)
        cells = [b and b["calls"], b and b["self_cpu_us"], o and o["calls"], o and o["self_cpu_us"]]
        cells.append(o and o["self_device_us"])
        print(f"| {k} | " + " | ".join("—" if c is None else f"{c:.1f}" for c in cells) + " |")
    print(
        json.dumps(
            {
                "bare_cpu_us_per_step": sum(v["self_cpu_us"] for v in bare.values()),
                "train_model_top_ops_cpu_us_per_step": sum(v["self_cpu_us"] for v in ours.values()),
            }
        )
    )


if __name__ == "__main__":
    main()
