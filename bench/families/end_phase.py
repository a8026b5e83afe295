"""A big model's run ends as fast as its disk allows (issue 56): train_model's end phase, from its last step's
end to the process's exit (the last checkpoint, the model written and proven to load, the model logged to a
SQLite store whose artifacts lie on the same disk, the run's figures), against one
``safetensors.torch.save_file`` of the same weights to the same disk, fsynced (bench/probes/weights_write.py),
in the same run.

On CPU: builtin:mlp 64-11264×3-10 (254M parameters, 1.0 GB of fp32 weights; SGD with momentum, so the last
checkpoint holds 2 GB) for three steps. The GPU check (bench/gpu/device_check.sh) runs the same family at the
1B shape with TRAINPIPE_BENCH_END_* set:

- ``TRAINPIPE_BENCH_END_HIDDEN`` (``11264,11264,11264``), ``_DEVICE`` (``cpu``), ``_PRECISION`` (``fp32``),
  ``_BATCH`` (32), ``_EPOCHS`` (1), ``_MAX_STEPS`` (3; 0 for none), ``_COPIES`` (digits repeated, 1).
"""

from __future__ import annotations

import os
from typing import Any

from bench.common import PROBES, PY, Bench, alternate, digits, result, row, sh, train


def _env(name: str, default: str) -> str:
    return os.environ.get(f"TRAINPIPE_BENCH_END_{name}", default)


def run(b: Bench) -> list[dict[str, Any]]:
    hidden = [int(h) for h in _env("HIDDEN", "11264,11264,11264").split(",")]
    device, precision = _env("DEVICE", "cpu"), _env("PRECISION", "fp32")
    batch, epochs, max_steps = int(_env("BATCH", "32")), int(_env("EPOCHS", "1")), int(_env("MAX_STEPS", "3"))
    copies = int(_env("COPIES", "1"))
    csv = b.work / f"digits-x{copies}.csv"
    if not csv.exists():
        digits(csv, copies)
    written: list[dict[str, Any]] = []
    ends: list[dict[str, Any]] = []

    def base() -> float:
        written.append(
            result(sh(PY, str(PROBES / "weights_write.py"), ",".join(map(str, hidden)), str(b.work / "w"))[1])
        )
        return written[-1]["s"]

    def ours() -> float:
        extra: dict[str, Any] = {"max_steps": max_steps} if max_steps else {}
        _, r, tele, _ = train(
            b.work,
            csv,
            "end-phase",
            1,
            batch,
            epochs,
            threads=os.cpu_count() or 1,
            train_config={"hidden_units": hidden, "learning_rate": 0.01},
            device=device,
            precision=precision,
            **extra,
        )
        ckpt = tele["checkpoints"] or {}
        ends.append(
            {
                "end_s": round(tele["last_step_to_exit_s"], 3),
                "steps": tele["global_steps"],
                "last_checkpoint_write_s": (ckpt.get("recent", {}).get("write_s") or [None])[-1],
                "checkpoint_bytes": ckpt.get("staged_bytes"),
                "model_bytes": os.path.getsize(b.work / "end-phase" / "model.safetensors"),
                "device": r["device"],
            }
        )
        return tele["last_step_to_exit_s"]

    bs, os_ = alternate(base, ours, b.repeats)
    shape = (
        f"MLP 64-{'-'.join(map(str, hidden))}-10 ({written[-1]['params'] / 1e6:.0f}M parameters), {device}, {precision}"
    )
    b.note("end_phase", {"shape": shape, "weights_bytes": written[-1]["bytes"], "runs": ends})
    return [
        row(
            f"train_model's end phase, last step to exit ({shape})",
            "one safetensors save_file of the same weights, fsynced",
            "s",
            bs,
            os_,
            "≤ 1.5×",
            False,
            lambda r, *_: r <= 1.5,
        )
    ]
