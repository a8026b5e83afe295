"""Data beyond memory: a directory of Parquet files is validated file by file, snapshotted as one DVC
directory, and trained on by streaming row groups per rank, in bounded memory.

The bound is measured, not assumed: the peak RSS of a rank that streams a small directory, plus
the stated allowance (two row groups and a batch in flight, and allocator slack). The large
directory holds nearly twice the allowance more float32 feature bytes than the small one: a rank that
loaded it would pass the bound by that much; a rank streaming it stays under it. (A rank's imports alone
hold about 340 MB, so a directory larger than the whole bound would take minutes to write and train on,
and would show nothing more: what is measured is how memory grows with the data, and it must not.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import result_of, run_component
from trainpipe.demo import write_parquet_dir

pytestmark = pytest.mark.integration

FEATURES = 40  # write_parquet_dir's default
ALLOWANCE_MB = 160.0  # above the small run's peak: read-ahead, a batch, the allocator's arenas
BIG_ROWS = 2_000_000  # 305 MB of float32 features: 290 MB more than the small directory, nearly twice the allowance


def peak_rss(out: Path) -> float:
    return max(json.loads(p.read_text())["peak_rss_mb"] for p in (out / "telemetry").glob("rank*.json"))


def test_a_parquet_directory_larger_than_the_memory_bound_trains_within_it(tmp_path, mlflow_server):
    """Slow on purpose (about a minute): the bound is measured on a small run, then a directory with far more
    feature bytes than the bound's allowance trains on 2 ranks within it."""
    small = write_parquet_dir(tmp_path / "small", 100_000, 2)
    big = write_parquet_dir(tmp_path / "big", BIG_ROWS, 8, seed=1)
    feature_mb = BIG_ROWS * FEATURES * 4 / 2**20

    def train(data: Path, out: Path):
        return result_of(
            run_component(
                "train_model",
                "--data",
                str(data),
                "--output-dir",
                str(out),
                "--tracking-uri",
                mlflow_server,
                "--epochs",
                "1",
                "--batch-size",
                "4096",
                "--checkpoint-every-steps",
                "0",
                "--train-config",
                '{"hidden_units": [32], "learning_rate": 0.1}',
                timeout=900,
            )
        )

    base = train(small, tmp_path / "small-m")
    bound = peak_rss(tmp_path / "small-m") + ALLOWANCE_MB
    print(
        f"bound {bound:.0f} MB (small run's peak + {ALLOWANCE_MB:.0f}); the large directory's features: "
        f"{feature_mb:.0f} MB"
    )
    small_mb = 100_000 * FEATURES * 4 / 2**20
    assert feature_mb - small_mb > 1.8 * ALLOWANCE_MB, "loading the large directory must pass the bound"
    r = train(big, tmp_path / "big-m")
    assert peak_rss(tmp_path / "big-m") <= bound
    assert r["metrics"]["accuracy"] > 0.9 and base["global_steps"] < r["global_steps"]
    # every row group of the training split went through the ranks: one epoch's worth of batches
    steps = [json.loads(p.read_text())["global_steps"] for p in (tmp_path / "big-m" / "telemetry").glob("rank*.json")]
    assert steps == [r["global_steps"]] * 2 and r["global_steps"] >= int(0.79 * BIG_ROWS) // 4096


def test_a_parquet_directory_is_validated_snapshotted_and_evaluated_as_one_dataset(tmp_path, mlflow_server):
    """Slow on purpose (about a minute): validate, snapshot, train and evaluate each run as their own process on
    a directory of three Parquet files, since the directory must travel through every step as one dataset."""
    import pandas as pd

    raw = write_parquet_dir(tmp_path / "raw", 20_000, 3)
    v = result_of(run_component("validate_data", "--data", str(raw), "--output-dir", str(tmp_path / "v")))
    assert v["files"] == 3 and v["rows"] == 19_998 and v["data_md5"].endswith(".dir")
    s = result_of(
        run_component(
            "snapshot_dataset",
            "--data",
            str(tmp_path / "v"),
            "--output-dir",
            str(tmp_path / "s"),
            "--repo-dir",
            str(tmp_path / "repo"),
            "--remote-url",
            str(tmp_path / "remote"),
        )
    )
    assert s["md5"] == v["data_md5"]  # DVC's directory hash is the one validate_data computed
    assert sorted(p.name for p in (tmp_path / "s" / "raw").iterdir()) == [
        "part-000.parquet",
        "part-001.parquet",
        "part-002.parquet",
    ]
    result_of(
        run_component(
            "train_model",
            "--data",
            str(tmp_path / "s"),
            "--output-dir",
            str(tmp_path / "m"),
            "--tracking-uri",
            mlflow_server,
            "--epochs",
            "2",
            "--nproc-per-node",
            "1",
            "--batch-size",
            "256",
        )
    )
    e = result_of(
        run_component(
            "evaluate_model",
            "--model",
            str(tmp_path / "m"),
            "--data",
            str(tmp_path / "s"),
            "--output-dir",
            str(tmp_path / "e"),
        )
    )
    # the held-out rows are the same ones an in-memory read of the whole table would hold out
    from trainpipe.data.tabular import split_indices

    _, test_idx = split_indices(19_998, 0.2, 0)
    assert e["n_test"] == len(test_idx) and e["metrics"]["accuracy"] > 0.9
    # a row group with a bad value stops validation, naming the file and the row
    bad = tmp_path / "bad"
    bad.mkdir()
    for i, part in enumerate(sorted(raw.iterdir())):
        df = pd.read_parquet(part)
        if i == 1:
            df["f3"] = df["f3"].astype(str)
            df.loc[7, "f3"] = "N/A"
        df.to_parquet(bad / part.name, index=False)
    proc = run_component("validate_data", "--data", str(bad), "--output-dir", str(tmp_path / "vb"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert (
        "column=f3" in proc.stderr.strip().splitlines()[-1]
        and "part-001.parquet" in proc.stderr.strip().splitlines()[-1]
    )
