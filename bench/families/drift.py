"""detect_drift on 1M × 20 numeric rows (one column shifted) against the same statistics computed
directly with scipy (the baseline samples the same 100,000 rows a side and computes the normed
Wasserstein distance per column): process wall, and detect_drift's peak RSS."""

from __future__ import annotations

import shutil
from typing import Any

from bench.common import BASELINES, PY, Bench, alternate, peak_rss_mb, result, row, sh

SAMPLE = 100_000


def run(b: Bench) -> list[dict[str, Any]]:
    import numpy as np
    import pandas as pd

    ref, cur = b.work / "drift-ref.parquet", b.work / "drift-cur.parquet"
    if not cur.exists():
        rng = np.random.default_rng(0)
        cols = [f"f{i}" for i in range(20)]
        pd.DataFrame(rng.normal(size=(b.rows, 20)), columns=cols).to_parquet(ref)
        moved = pd.DataFrame(rng.normal(size=(b.rows, 20)), columns=cols)
        moved["f3"] += 0.5
        moved.to_parquet(cur)
    args = ["--data", str(cur), "--reference", str(ref), "--sample-size", str(SAMPLE)]

    def base() -> float:
        wall, out = sh(PY, str(BASELINES / "bare_drift.py"), str(ref), str(cur), str(SAMPLE))
        assert result(out)["drifted"] == ["f3"]
        return wall

    def ours() -> float:
        shutil.rmtree(b.work / "drift-out", ignore_errors=True)
        wall, out = sh(PY, "-m", "trainpipe.components.detect_drift", *args, "--output-dir", str(b.work / "drift-out"))
        assert result(out)["drifted_columns"] == ["f3"]
        return wall

    rows = [
        row(
            f"detect_drift ({b.rows:,} × 20 numeric, {SAMPLE:,} sampled a side, process wall)",
            "the same statistics with scipy called directly",
            "s",
            *alternate(base, ours, b.repeats),
            "≤ 1.2×",
            False,
            lambda r, mb, mo: r <= 1.2,
        )
    ]
    shutil.rmtree(b.work / "drift-out", ignore_errors=True)
    _, _, rss = peak_rss_mb(
        PY, "-m", "trainpipe.components.detect_drift", *args, "--output-dir", str(b.work / "drift-out")
    )
    _, _, rss_base = peak_rss_mb(PY, str(BASELINES / "bare_drift.py"), str(ref), str(cur), str(SAMPLE))
    b.note("detect_drift_peak_rss_mb", round(rss, 1))
    b.note("bare_drift_peak_rss_mb", round(rss_base, 1))
    print(f"  detect_drift peak RSS {rss:.0f} MB (the scipy baseline {rss_base:.0f} MB)")
    return rows
