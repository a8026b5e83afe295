"""What every benchmark family shares: running commands, timing pairs in ABBA order, a row of the
results table, and the data the families train on. No family keeps state of its own: a
:class:`Bench` (the work folder, the repeats, what the run noted) is passed to each."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BASELINES = REPO / "bench" / "baselines"
PROBES = REPO / "bench" / "probes"
FIXTURES = REPO / "tests" / "fixtures"
PY = sys.executable
#: The team's package (tests/fixtures/teampkg) and the baselines' shared module, for the processes that import them.
TEAM_PATH = {"PYTHONPATH": os.pathsep.join([str(FIXTURES), str(BASELINES)])}


class BenchError(Exception):
    """A benchmark could not run (a command failed); the others still run."""


@dataclass
class Bench:
    """One run of ``make bench``: where it works, how often it repeats, and what it noted besides rows."""

    work: Path
    repeats: int
    rows: int = 1_000_000
    extra: dict[str, Any] = field(default_factory=dict)

    def note(self, key: str, value: Any) -> None:
        self.extra[key] = value


def sh(*cmd: str, env: dict | None = None, cwd: Path | None = None) -> tuple[float, str]:
    """Run a command; its wall seconds and stdout.

    Raises:
        BenchError: it failed (with the end of its stderr).
    """
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd, check=False)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd[:4])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def peak_rss_mb(*cmd: str, env: dict | None = None) -> tuple[float, str, float]:
    """Wall seconds, stdout and the peak RSS (MB) of the largest process the command ran."""
    proc = subprocess.run(
        [PY, str(PROBES / "peak_rss.py"), *cmd],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    doc = json.loads(proc.stdout)
    if doc["rc"] != 0:
        raise BenchError(f"{' '.join(cmd[:4])} failed ({doc['rc']}):\n{proc.stderr[-2000:]}")
    return doc["wall"], doc["out"], doc["rss"]


def result(out: str) -> dict[str, Any]:
    """The JSON object a command printed last."""
    return json.loads(out.strip().splitlines()[-1])


def alternate(
    baseline: Callable[[], float], ours: Callable[[], float], repeats: int
) -> tuple[list[float], list[float]]:
    """``repeats`` pairs in ABBA order: whatever one run leaves behind (dirty pages being written back,
    a cooling core) falls on the baseline and on trainpipe equally often."""
    b, o = [], []
    for i in range(repeats):
        if i % 2:
            o.append(ours())
            b.append(baseline())
        else:
            b.append(baseline())
            o.append(ours())
    return b, o


def row(
    name: str,
    baseline: str,
    unit: str,
    base: list[float],
    ours: list[float],
    target: str,
    higher_is_better: bool,
    met: Callable[[float, float, float], bool] | None = None,
    note: str = "",
) -> dict[str, Any]:
    """A row of the table: the median of the pairs' ratios, their spread, and whether the target is met."""
    ratios = [o / b for b, o in zip(base, ours, strict=True)]
    med = statistics.median(ratios)
    mb, mo = statistics.median(base), statistics.median(ours)
    print(
        f"  {name}: baseline {mb:.4g} {unit}, trainpipe {mo:.4g} {unit}, ratio {med:.3f} "
        f"[{min(ratios):.3f}–{max(ratios):.3f}]",
        file=sys.stderr,
    )
    return {
        "benchmark": name,
        "baseline": baseline,
        "unit": unit,
        "baseline_median": mb,
        "trainpipe_median": mo,
        "ratio_median": med,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "repeats": len(ratios),
        "target": target,
        "met": met(med, mb, mo) if met else None,
        "higher_is_better": higher_is_better,
        "note": note,
    }


def digits(path: Path, copies: int = 1) -> Path:
    from trainpipe.demo import write_digits

    write_digits(path)
    if copies > 1:
        import pandas as pd

        df = pd.read_csv(path)
        pd.concat([df] * copies, ignore_index=True).to_csv(path, index=False)
    return path


def snapshot(work: Path, data: Path, name: str) -> Path:
    """A validated + snapshotted copy of ``data`` (the input train_model takes)."""
    v, s = work / f"{name}-validated", work / f"{name}-snapshot"
    sh(PY, "-m", "trainpipe.components.validate_data", "--data", str(data), "--output-dir", str(v))
    sh(
        PY,
        "-m",
        "trainpipe.components.snapshot_dataset",
        "--data",
        str(v),
        "--output-dir",
        str(s),
        "--repo-dir",
        str(work / f"{name}-repo"),
        "--remote-url",
        str(work / f"{name}-remote"),
        "--dataset-name",
        name,
    )
    return s


def digits_snapshot(work: Path, copies: int = 1) -> Path:
    """digits (``copies`` times over), validated and snapshotted once per run, whichever benchmark asks first."""
    name = "digits" if copies == 1 else f"digitsx{copies}"
    snap = work / f"{name}-snapshot"
    if snap.is_dir():
        return snap
    return snapshot(work, digits(work / ("digits.csv" if copies == 1 else f"digits-x{copies}.csv"), copies), name)


def data_file(snap: Path) -> Path:
    return next(p for p in snap.iterdir() if p.suffix in (".csv", ".parquet"))


def train(
    work: Path,
    snap: Path,
    out: str,
    nproc: int,
    batch: int,
    epochs: int,
    threads: int = 1,
    env: dict | None = None,
    **extra: Any,
) -> tuple[float, dict, dict, float]:
    """train_model on a snapshot (or a raw file or Parquet folder): wall, result, rank-0 telemetry
    (with ``launch_to_first_step_s`` and ``last_step_to_exit_s``), peak RSS."""
    config = json.dumps(extra.pop("train_config", {"hidden_units": [64], "learning_rate": 0.05}))
    args = [
        "--data",
        str(snap),
        "--output-dir",
        str(work / out),
        "--nproc-per-node",
        str(nproc),
        "--batch-size",
        str(batch),
        "--epochs",
        str(epochs),
        "--train-config",
        config,
        "--seed",
        "0",
        "--tracking-uri",
        f"sqlite:///{work / 'mlflow.db'}",
        "--checkpoint-every-steps",
        "0",
    ]
    for k, v in extra.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    shutil.rmtree(work / out, ignore_errors=True)
    launched = time.time()
    wall, out_s, rss = peak_rss_mb(
        PY, "-m", "trainpipe.components.train_model", *args, env={"OMP_NUM_THREADS": str(threads), **(env or {})}
    )
    tele = json.loads((work / out / "telemetry" / "rank0.json").read_text())
    tele["launch_to_first_step_s"] = tele["first_step_unix"] - launched if tele.get("first_step_unix") else None
    tele["last_step_to_exit_s"] = (
        launched + wall - (tele["first_step_unix"] + tele["steps"][-1]["t"] - tele["steps"][0]["t"])
        if tele.get("first_step_unix")
        else None
    )
    return wall, result(out_s), tele, rss


def torchrun(script: Path, nproc: int, *args: str, env: dict | None = None) -> tuple[float, dict]:
    """A bare baseline under torchrun: its process wall and rank 0's JSON line."""
    wall, out = sh(
        str(Path(PY).parent / "torchrun"), "--standalone", "--nproc_per_node", str(nproc), str(script), *args, env=env
    )
    return wall, result(out)


def bare_ddp(data: Path, nproc: int, epochs: int, batch: int, hidden: str, env: dict[str, str]) -> dict[str, Any]:
    """The bare DDP loop under torchrun on ``data`` (lr 0.05, seed 0, as train() runs): rank 0's result."""
    return torchrun(
        BASELINES / "bare_ddp.py", nproc, str(data), "label", str(epochs), str(batch), "0.05", "0", hidden, env=env
    )[1]


def bare_team(data: Path, nproc: int, epochs: int, batch: int) -> dict[str, Any]:
    """The team's function as a bare torchrun script (bare_team.py): rank 0's figures, the process
    wall, and its launch-to-first-step and last-step-to-exit times."""
    launched = time.time()
    wall, r = torchrun(
        BASELINES / "bare_team.py",
        nproc,
        str(data),
        "label",
        str(epochs),
        str(batch),
        "0",
        env={**TEAM_PATH, "OMP_NUM_THREADS": "1"},
    )
    return {
        **r,
        "process_wall_s": wall,
        "launch_to_first_step_s": r["first_step_unix"] - launched,
        "last_step_to_exit_s": launched + wall - r["last_step_unix"],
    }


def parquet_dir(path: Path, rows: int, files: int, seed: int = 0) -> Path:
    """The synthetic Parquet table of ``trainpipe.demo`` (40 features, 50,000-row groups); made once per run."""
    from trainpipe.demo import write_parquet_dir

    return path if path.is_dir() else write_parquet_dir(path, rows, files, seed=seed)


def steady_sps(tele: dict) -> float:
    """Samples per second from the end of step 5 to the end of the last step: everything the loop
    does between steps counts (metrics, epoch-end reductions), as in the bare loop."""
    steps = tele["steps"]
    return sum(s["samples"] for s in steps[5:]) * tele["world_size"] / (steps[-1]["t"] - steps[4]["t"])
