"""validate_data against Great Expectations called directly and plain pandas; snapshot_dataset
against md5sum and DVC by hand; DVC's own floor on a folder of 10,000 files."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from typing import Any

from bench.common import BASELINES, PY, Bench, alternate, digits_snapshot, row, sh


def validate(b: Bench) -> list[dict[str, Any]]:
    import numpy as np
    import pandas as pd

    from trainpipe.data.preconditions import training_suite

    raw = digits_snapshot(b.work).parent / "digits.csv"
    suite = b.work / "default-suite.json"  # the suite validate_data runs by default, for GX called by hand
    suite.write_text(
        json.dumps(training_suite(list(pd.read_csv(raw, nrows=0).columns), "label", "classification", 64, 0.2, 0))
    )

    def base() -> float:
        # analytics off, as validate_data runs it: with no route to GX's analytics host its calls wait
        return sh(
            PY,
            str(BASELINES / "bare_gx.py"),
            str(raw),
            str(suite),
            "label",
            cwd=b.work,
            env={"GX_ANALYTICS_ENABLED": "False"},
        )[0]

    def ours(*suite_file: str) -> float:
        shutil.rmtree(b.work / "v", ignore_errors=True)
        args = ("--data", str(raw), "--output-dir", str(b.work / "v"), *suite_file)
        return sh(PY, "-m", "trainpipe.components.validate_data", *args)[0]

    rows = [
        row(
            "validate_data, default suite (checked in pandas with GX's results, its Data Docs drawn without GX; "
            "digits, process wall)",
            "the same suite with GX called directly",
            "s",
            *alternate(base, ours, b.repeats),
            "≤ 0.5×",
            False,
            lambda r, *_: r <= 0.5,
        ),
        row(
            "validate_data on GX: the same suite as a user's suite file (GX's checkpoint and Data Docs; digits, "
            "process wall)",
            "the same suite with GX called directly",
            "s",
            *alternate(base, lambda: ours("--suite", str(suite)), b.repeats),
            "≤ 1.10× and ≤ +0.2 s",
            False,
            lambda r, mb, mo: r <= 1.10 and mo - mb <= 0.2,
        ),
    ]
    big = b.work / "big.csv"
    rng = np.random.default_rng(0)
    pd.DataFrame(rng.normal(size=(b.rows, 10)), columns=[f"f{i}" for i in range(10)]).assign(
        label=rng.integers(0, 5, b.rows)
    ).to_csv(big, index=False)

    def pandas_checks() -> float:
        return sh(PY, str(BASELINES / "bare_pandas.py"), str(big), "label")[0]

    def ours_big() -> float:
        shutil.rmtree(b.work / "vb", ignore_errors=True)
        return sh(
            PY, "-m", "trainpipe.components.validate_data", "--data", str(big), "--output-dir", str(b.work / "vb")
        )[0]

    rows.append(
        row(
            f"validate_data scale ({b.rows:,} × 10 rows)",
            "plain pandas checks of the same rules",
            "s",
            *alternate(pandas_checks, ours_big, max(1, b.repeats - 1)),
            "report",
            False,
        )
    )
    return rows


def snapshot(b: Bench) -> list[dict[str, Any]]:
    import numpy as np
    import pandas as pd

    vdir = b.work / "snapv"
    if not vdir.exists():
        data = b.work / "snap.csv"
        rng = np.random.default_rng(1)
        pd.DataFrame(rng.normal(size=(400_000, 20))).assign(label=rng.integers(0, 2, 400_000)).to_csv(data, index=False)
        sh(PY, "-m", "trainpipe.components.validate_data", "--data", str(data), "--output-dir", str(vdir))
    f = next(p for p in vdir.iterdir() if p.suffix == ".csv")
    size_mb = f.stat().st_size / 1e6
    n = [0]

    def md5() -> float:
        return sh("md5sum", str(f))[0]

    def bare_dvc() -> float:
        n[0] += 1
        repo, remote = b.work / f"bare-{n[0]}", b.work / f"bare-remote-{n[0]}"
        repo.mkdir()
        shutil.copy(f, repo / f.name)
        t = time.perf_counter()
        sh("git", "init", "-q", cwd=repo)
        sh(PY, "-m", "dvc", "init", "-q", cwd=repo)
        sh(PY, "-m", "dvc", "remote", "add", "-d", "storage", str(remote), cwd=repo)
        sh(PY, "-m", "dvc", "add", "-q", f.name, cwd=repo)
        sh(PY, "-m", "dvc", "push", "-q", cwd=repo)
        return time.perf_counter() - t

    def ours(repo: str | None = None) -> float:
        n[0] += 1
        repo = repo or f"{n[0]}"
        return sh(
            PY,
            "-m",
            "trainpipe.components.snapshot_dataset",
            "--data",
            str(vdir),
            "--output-dir",
            str(b.work / f"s-{n[0]}"),
            "--repo-dir",
            str(b.work / f"repo-{repo}"),
            "--remote-url",
            str(b.work / f"remote-{repo}"),
            "--dataset-name",
            "bench",
        )[0]

    rows = [
        row(
            f"snapshot_dataset vs md5sum ({size_mb:.0f} MB)",
            "md5sum of the same bytes",
            "s",
            *alternate(md5, ours, b.repeats),
            "report",
            False,
        ),
        row(
            f"snapshot_dataset vs bare DVC ({size_mb:.0f} MB)",
            "git init + dvc init/add/push by hand",
            "s",
            *alternate(bare_dvc, ours, b.repeats),
            "≤ 1.10×",
            False,
            lambda r, *_: r <= 1.10,
        ),
    ]
    ours("again")
    b.note("snapshot_unchanged_resnapshot_s", round(statistics.median(ours("again") for _ in range(b.repeats)), 2))
    # snapshot_dataset tracks one table or one Parquet folder per dataset; this is DVC's own directory
    # tracking, the floor any snapshot of a folder of small files has: dvc add + push, then unchanged
    tree = b.work / "tree-repo"
    (tree / "shards").mkdir(parents=True)
    for i in range(10_000):
        (tree / "shards" / f"{i:05d}.txt").write_text(f"{i}\n")
    sh("git", "init", "-q", cwd=tree)
    sh(PY, "-m", "dvc", "init", "-q", cwd=tree)
    sh(PY, "-m", "dvc", "remote", "add", "-d", "storage", str(b.work / "tree-remote"), cwd=tree)

    def add_push() -> float:
        return sh(PY, "-m", "dvc", "add", "-q", "shards", cwd=tree)[0] + sh(PY, "-m", "dvc", "push", "-q", cwd=tree)[0]

    first = add_push()
    b.note(
        "dvc_10k_files",
        {
            "first add + push_s": round(first, 2),
            "unchanged add + push_s": round(statistics.median(add_push() for _ in range(b.repeats)), 2),
        },
    )
    return rows
