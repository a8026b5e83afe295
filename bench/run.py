"""`make bench`: what trainpipe costs over doing the same by hand, each figure a ratio against a
baseline measured in the same run (baseline and trainpipe alternate, repeated; median and spread).

python bench/run.py [--repeats N] [--rows N] [--only NAME,…]
Writes bench/results/<date>.json (not with --only) and prints a markdown table. Exits 1 when a
benchmark could not run (a missed target is reported, not an error). The families live in
bench/families/, one module each; what they share is bench/common.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench.* imports from the checkout
    sys.path.insert(0, str(REPO))

from bench.common import PY, Bench, BenchError, sh  # noqa: E402
from bench.families import FAMILIES  # noqa: E402


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| benchmark | baseline (same run) | baseline | trainpipe | ratio (median, min–max) | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = "—" if r["baseline_median"] is None else f"{r['baseline_median']:.4g} {r['unit']}"
        ratio = (
            "—" if r["ratio_median"] is None else f"{r['ratio_median']:.3f} ({r['ratio_min']:.3f}–{r['ratio_max']:.3f})"
        )
        met = {True: "yes", False: "**no**", None: "—"}[r["met"]]
        note = f" ({r['note']})" if r["note"] else ""
        lines.append(
            f"| {r['benchmark']}{note} | {r['baseline']} | {b} | {r['trainpipe_median']:.4g} {r['unit']} | {ratio} | "
            f"{r['target']} | {met} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the validate_data scale benchmark")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated families to run (" + ", ".join(FAMILIES) + "); prints, writes no results file",
    )
    args = ap.parse_args(argv)
    args.only = [name for name in args.only.split(",") if name]
    if unknown := [name for name in args.only if name not in FAMILIES]:
        ap.error(f"--only: unknown benchmark {unknown[0]!r} (known: {', '.join(FAMILIES)})")
    return args


def run_families(bench: Bench, only: list[str]) -> list[dict[str, Any]]:
    """Every chosen family's rows; one that cannot run is noted under ``failed`` and the others still run."""
    rows: list[dict[str, Any]] = []
    for name, family in FAMILIES.items():
        if only and name not in only:
            continue
        print(name, file=sys.stderr)
        try:
            rows += family(bench)
        except BenchError as exc:  # a command failed: its own output says why
            bench.extra.setdefault("failed", []).append(f"{name}: {str(exc)[:500]}")
            print(f"  failed: {str(exc)[:500]}", file=sys.stderr)
        except Exception as exc:  # a bug in the family: the others' figures are still worth keeping
            import traceback

            traceback.print_exc()
            bench.extra.setdefault("failed", []).append(f"{name}: {type(exc).__name__}: {str(exc)[:500]}")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {memory} GiB, Python {platform.python_version()}"
    # trainpipe's own modules get their bytecode, as an installed package (and the images) have it;
    # an editable checkout under PYTHONDONTWRITEBYTECODE would compile them from source in every process
    sh(PY, "-m", "compileall", "-q", str(REPO / "src"), str(REPO / "components"), str(REPO / "pipelines"))
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("TRAINPIPE_IMAGE", None)
    bench = Bench(work=Path(tempfile.mkdtemp(prefix="trainpipe-bench-")), repeats=args.repeats, rows=args.rows)
    try:
        rows = run_families(bench, args.only)
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)
    today = date.today().isoformat()
    if not args.only:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{today}.json").write_text(
            json.dumps({"date": today, "machine": machine, "results": rows, "also": bench.extra}, indent=2) + "\n"
        )
    print(f"## trainpipe bench, {today} ({machine})\n")
    print(table(rows))
    print("\n```json\n" + json.dumps(bench.extra, indent=2, ensure_ascii=False) + "\n```")
    if bench.extra.get("failed"):
        print(f"bench: {len(bench.extra['failed'])} benchmark(s) could not run (see 'failed' above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
