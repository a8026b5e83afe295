"""Where CUDA is present: train_model on NCCL against the bare DDP loop on NCCL, bf16 autocast
against fp32, and the MFU profile_training reports for the bf16 run. Skipped, with the reason
printed and noted, where it is not: `make bench` never fails for lack of a GPU."""

from __future__ import annotations

import sys
from typing import Any

from bench.common import PY, Bench, alternate, bare_ddp, data_file, digits_snapshot, result, row, sh, steady_sps, train

SKIPPED = "skipped: no CUDA device on this machine (NCCL, AMP speedup and MFU run where one is present)"


def cuda_devices() -> int:
    return int(sh(PY, "-c", "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")[1].strip())


def run(b: Bench) -> list[dict[str, Any]]:
    n = cuda_devices()
    if not n:
        b.note("gpu", SKIPPED)
        print(f"gpu: {SKIPPED}", file=sys.stderr)
        return []
    # big enough that a step is matmuls, not launches: MLP 64-4096-4096-10, 4096 rows a rank, 64× digits
    nproc, hidden, epochs = min(n, 2), [4096, 4096], 10
    batch = 4096 * nproc
    snap = digits_snapshot(b.work, 64)
    shape = f"{nproc} GPU{'s' if nproc > 1 else ''}, MLP 64-4096-4096-10, batch {batch}"

    def bare() -> float:
        return bare_ddp(data_file(snap), nproc, epochs, batch, ",".join(map(str, hidden)), {"BARE_DEVICE": "cuda"})["samples_per_second"]

    def ours(precision: str) -> float:
        return steady_sps(train(b.work, snap, f"gpu-{precision}", nproc, batch, epochs, train_config={"hidden_units": hidden, "learning_rate": 0.05},
                                device="cuda", dist_backend="nccl", precision=precision)[2])

    rows = [
        row(f"train_model overhead on NCCL ({shape}, fp32)", "bare torch DDP loop on NCCL", "samples/s", *alternate(bare, lambda: ours("fp32"), b.repeats),
            "≥ 0.97", True, lambda r, *_: r >= 0.97),
        row(f"AMP speedup under train_model ({shape}, bf16 autocast)", "the same run in fp32", "samples/s",
            *alternate(lambda: ours("fp32"), lambda: ours("bf16"), b.repeats), "report", True),
    ]
    _, out = sh(PY, "-m", "trainpipe.components.profile_training", "--model", str(b.work / "gpu-bf16"), "--output-dir", str(b.work / "gpu-profile"),
                "--tracking-uri", f"sqlite:///{b.work / 'mlflow.db'}")
    p = result(out)
    b.note("gpu", "ran")
    b.note("gpu_mfu_bf16", {"device": p["device"], "mfu": p["mfu"], "achieved_tflops": p["achieved_tflops"], "peak_tflops": p["peak_tflops"],
                            "peak_source": p["peak_source"], "samples_per_second": round(p["samples_per_second"], 1)})
    return rows
