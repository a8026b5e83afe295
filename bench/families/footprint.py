"""Peak RSS of each component's process on digits (train_model's per rank comes from its telemetry)."""

from __future__ import annotations

from typing import Any

from bench.common import PY, Bench, digits_snapshot, peak_rss_mb, train


def run(b: Bench) -> list[dict[str, Any]]:
    track = f"sqlite:///{b.work / 'mlflow.db'}"
    rss = b.extra.setdefault("peak_rss_mb", {})
    snap = digits_snapshot(b.work, 16)
    digits_snapshot(b.work)  # digits.csv
    tele = train(b.work, snap, "rss-train", 2, 64, 1)[2]
    rss["train_model (per rank, rank 0)"] = round(tele["peak_rss_mb"], 1)
    model = str(b.work / "rss-train")
    steps = {
        "validate_data": ["--data", str(b.work / "digits.csv"), "--output-dir", str(b.work / "r-v")],
        "snapshot_dataset": [
            "--data",
            str(b.work / "r-v"),
            "--output-dir",
            str(b.work / "r-s"),
            "--repo-dir",
            str(b.work / "r-repo"),
            "--remote-url",
            str(b.work / "r-remote"),
        ],
        "profile_training": ["--model", model, "--output-dir", str(b.work / "r-p"), "--tracking-uri", track],
        "evaluate_model": [
            "--model",
            model,
            "--data",
            str(snap),
            "--output-dir",
            str(b.work / "r-e"),
            "--tracking-uri",
            track,
            "--model-name",
            "bench",
        ],
        "register_model": [
            "--model",
            model,
            "--decision",
            str(b.work / "r-e"),
            "--training-profile",
            str(b.work / "r-p"),
            "--output-dir",
            str(b.work / "r-r"),
            "--tracking-uri",
            track,
            "--model-name",
            "bench",
        ],
    }
    for name, args in steps.items():
        rss[name] = round(peak_rss_mb(PY, "-m", f"trainpipe.components.{name}", *args)[2], 1)
    return []
