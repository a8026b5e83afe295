"""optimize_model's int8 variant under ONNX Runtime against the same trained model in torch eager
fp32 (a 64 → 512 → 512 → 10 MLP trained on digits), on the same held-out rows, one thread each, timed
by the same code: throughput at batch 256 (target ≥ 2×), p50 latency at batch 1, file size
(target ≤ 0.3×) and accuracy (target: at most 0.5 points lower)."""

from __future__ import annotations

import json
import shutil
from typing import Any

from bench.common import BASELINES, PY, REPO, Bench, alternate, digits_snapshot, result, row, sh, train


def run(b: Bench) -> list[dict[str, Any]]:
    import numpy as np

    from trainpipe.data.tabular import held_out

    snap = digits_snapshot(b.work)
    train(b.work, snap, "opt-model", 1, 64, 10, train_config={"hidden_units": [512, 512], "learning_rate": 0.01})
    shutil.rmtree(b.work / "opt-out", ignore_errors=True)
    _, out = sh(
        PY,
        "-m",
        "trainpipe.components.optimize_model",
        "--model",
        str(b.work / "opt-model"),
        "--data",
        str(snap),
        "--output-dir",
        str(b.work / "opt-out"),
        "--variants",
        '["int8_dynamic", "int8_static"]',
        "--max-metric-drop",
        "0.005",
    )
    opt = result(out)
    if opt["selected"] is None:
        raise AssertionError(f"no int8 variant within 0.5 points: {opt['reason']}")
    chosen = next(v for v in opt["variants"] if v["name"] == opt["selected"])
    fp32 = next(v for v in opt["variants"] if v["name"] == "fp32")
    import pandas as pd

    meta = json.loads((b.work / "opt-model" / "model.json").read_text())
    frame = pd.read_csv(next(p for p in snap.iterdir() if p.suffix == ".csv"))
    split = meta.get("split") or {}
    rows = frame.loc[
        held_out(np.arange(len(frame)), float(split.get("test_fraction", 0.2)), int(split.get("seed", 0))),
        meta["feature_columns"],
    ]
    np.save(b.work / "opt-rows.npy", rows.to_numpy(dtype=np.float32))
    timed: dict[str, list[dict[str, float]]] = {"base": [], "ours": []}

    def base() -> float:
        _, o = sh(
            PY,
            str(BASELINES / "bare_torch_infer.py"),
            str(b.work / "opt-model"),
            str(b.work / "opt-rows.npy"),
            env={"OMP_NUM_THREADS": "1"},
        )
        timed["base"].append(result(o))
        return timed["base"][-1]["rows_per_s"]

    def ours() -> float:
        _, o = sh(
            PY,
            str(REPO / "bench" / "probes" / "ort_infer.py"),
            str(b.work / "opt-out" / "model"),
            str(b.work / "opt-rows.npy"),
            env={"OMP_NUM_THREADS": "1"},
        )
        timed["ours"].append(result(o))
        return timed["ours"][-1]["rows_per_s"]

    base_rps, ours_rps = alternate(base, ours, b.repeats)
    variant = f"{opt['selected']} (ONNX Runtime)"
    size_fp32 = (b.work / "opt-model" / "model.safetensors").stat().st_size
    size_int8 = (b.work / "opt-out" / "model" / "model.onnx").stat().st_size
    b.note(
        "optimize",
        {
            "selected": opt["selected"],
            "fp32_accuracy": fp32["metric"],
            "int8_accuracy": chosen["metric"],
            "fp32_bytes": size_fp32,
            "int8_bytes": size_int8,
            "threads": 1,
            "cpu": opt["cpu"],
            "timings": timed,
            "optimize_model_figures": {
                v["name"]: {k: v[k] for k in ("latency_p50_ms", "throughput_rows_s", "size_bytes")}
                for v in opt["variants"]
            },
        },
    )
    return [
        row(
            f"{variant} vs fp32 torch eager, batch 256, 1 thread",
            "the same model in torch eager fp32",
            "rows/s",
            base_rps,
            ours_rps,
            "≥ 2×",
            True,
            lambda r, mb, mo: r >= 2.0,
        ),
        row(
            f"{variant} vs fp32 torch eager, batch 1 p50 latency, 1 thread",
            "the same model in torch eager fp32",
            "ms",
            [t["p50_ms"] for t in timed["base"]],
            [t["p50_ms"] for t in timed["ours"]],
            "report (lower is faster)",
            False,
        ),
        row(
            f"{variant} model file vs fp32 safetensors",
            "model.safetensors (fp32)",
            "bytes",
            [float(size_fp32)],
            [float(size_int8)],
            "≤ 0.3×",
            False,
            lambda r, mb, mo: r <= 0.3,
        ),
        row(
            f"{variant} accuracy on the {opt['n_test']} held-out rows",
            "fp32 torch eager's accuracy",
            "accuracy",
            [fp32["metric"]],
            [chosen["metric"]],
            "≥ fp32 − 0.5 points",
            True,
            lambda r, mb, mo: (mb - mo) * 100 <= 0.5,
        ),
    ]
