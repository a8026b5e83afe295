"""The bench runner's own rules: pairs in ABBA order, the ratio as the median of the pairs, one-line
usage errors, and the GPU benchmarks skipped with their reason where CUDA is absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.families import FAMILIES
from tests.conftest import REPO

pytestmark = pytest.mark.unit


@pytest.fixture()
def bench():
    sys.path.insert(0, str(REPO))
    try:
        import bench.common as common
    finally:
        sys.path.remove(str(REPO))
    return common


def test_pairs_alternate_which_runs_first(bench):
    calls: list[str] = []
    base, ours = bench.alternate(lambda: calls.append("b") or 2.0, lambda: calls.append("o") or 3.0, 4)
    assert calls == ["b", "o", "o", "b", "b", "o", "o", "b"]
    assert base == [2.0] * 4 and ours == [3.0] * 4


def test_ratio_is_the_median_of_the_pairs_ratios(bench):
    row = bench.row("x", "y", "s", [1.0, 2.0, 4.0], [2.0, 2.0, 2.0], "≥ 1", True, lambda r, *_: r >= 1)
    assert (row["ratio_median"], row["ratio_min"], row["ratio_max"], row["repeats"]) == (1.0, 0.5, 2.0, 3)
    assert row["met"] is True and row["baseline_median"] == 2.0


def test_unknown_benchmark_is_a_one_line_usage_error():
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--only", "training,nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(f"--only: unknown benchmark 'nope' (known: {', '.join(FAMILIES)})")
    )


def test_gpu_benchmarks_skip_with_their_reason_without_cuda(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--only", "gpu"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gpu: skipped: no CUDA device" in proc.stderr
    extra = json.loads(proc.stdout.split("```json", 1)[1].split("```", 1)[0])
    assert extra == {"gpu": "skipped: no CUDA device on this machine (the GPU rows run where one is present)"}
