"""mypy over the package as pip installs it, held to a recorded baseline that only goes down.

``scripts/mypy_baseline.json`` records how many errors each file has (by its path in this repository). A run
fails when a file has more errors than recorded, or a file that has none recorded has some: the new errors are
printed. When a file has fewer, the baseline is lowered in place (commit it), so the count never climbs back.

    python scripts/mypy_baseline.py build/lint-site            # check (make lint)
    python scripts/mypy_baseline.py build/lint-site --update   # record the counts as they are now

mypy's settings are pyproject's ``[tool.mypy]``; its cache is ``.mypy_cache`` in the repository, so a rerun on
unchanged files takes seconds.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "scripts" / "mypy_baseline.json"
#: An error line: ``path.py:line: error:``, or ``path.py: error:`` for one about the whole module.
ERROR = re.compile(r"^(?P<path>[^:\s]+\.py)(?::\d+)?(?::\d+)?: error: ")


def source_path(installed: str) -> str:
    """``trainpipe/components/x/core.py`` (as installed) is ``components/x/core.py`` here (pyproject's package-dir)."""
    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-dir"
    ]
    module = installed.removesuffix(".py").split("/")
    for depth in range(len(module), 0, -1):
        folder = package_dir.get(".".join(module[:depth]))
        if folder is not None:
            return "/".join([folder, *module[depth:]]) + ".py"
    return installed


def run_mypy(site: Path) -> tuple[Counter[str], dict[str, list[str]]]:
    """The errors per source file, and their lines, of ``mypy -p trainpipe`` in ``site``."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), "--cache-dir",
         str(REPO / ".mypy_cache"), "-p", "trainpipe"],
        cwd=site, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode not in (0, 1):
        sys.exit(f"mypy failed to run (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    counts: Counter[str] = Counter()
    lines: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        m = ERROR.match(line)
        if m:
            path = source_path(m["path"])
            counts[path] += 1
            lines.setdefault(path, []).append(path + line[len(m["path"]) :])
    return counts, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="where the package is installed (make lint's build/lint-site)")
    parser.add_argument("--update", action="store_true", help="record the counts as they are now")
    args = parser.parse_args(argv)
    counts, lines = run_mypy(args.site)
    baseline: dict[str, int] = json.loads(BASELINE.read_text(encoding="utf-8")) if BASELINE.is_file() else {}
    grown = sorted(p for p, n in counts.items() if n > baseline.get(p, 0))
    if grown and not args.update:
        for path in grown:
            print(f"{path}: {counts[path]} mypy errors, the baseline allows {baseline.get(path, 0)}:", file=sys.stderr)
            print("\n".join(lines[path]), file=sys.stderr)
        print(f"mypy: {len(grown)} file(s) over scripts/mypy_baseline.json (fix the new errors)", file=sys.stderr)
        return 1
    now = dict(counts) if args.update else {p: min(n, counts.get(p, 0)) for p, n in baseline.items()}
    new = {p: n for p, n in sorted(now.items()) if n}
    if new != baseline:
        BASELINE.write_text(json.dumps(new, indent=1) + "\n", encoding="utf-8")
        print(
            f"mypy: scripts/mypy_baseline.json now records {sum(new.values())} errors in {len(new)} files (commit it)"
        )
    else:
        print(f"mypy: {sum(counts.values())} errors in {len(counts)} files, as recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
