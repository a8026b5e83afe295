#!/usr/bin/env python3
"""`make audit`: the vulnerability audit of the pinned set (the test venv's constraints and every image lock).

Runs pip-audit against PyPI's advisory service. Any known vulnerability fails the audit
unless `images/audit-exceptions.txt` lists its id with a written justification
(`ID  # why it does not apply, and until when`). When the advisory database cannot be
reached for a package, the audit does not pass silently: it exits 75 saying how many
packages went unaudited, so run it where PyPI's JSON API is reachable.

Exit codes: 0 audited and clean, 1 vulnerabilities without a justification, 75 not auditable from here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = [
    "images/constraints.txt",
    "images/cpu/requirements.lock",
    "images/gpu/requirements.lock",
    "images/data/requirements.lock",
]
EXCEPTIONS = ROOT / "images" / "audit-exceptions.txt"


def exceptions() -> dict[str, str]:
    """Vulnerability id -> justification; an entry without one is an error."""
    out = {}
    for n, line in enumerate(EXCEPTIONS.read_text().splitlines() if EXCEPTIONS.exists() else [], start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        vid, _, why = line.partition("#")
        if not why.strip():
            sys.exit(f"audit: {EXCEPTIONS.name} line {n}: {vid.strip()} has no justification after '#'")
        out[vid.strip()] = why.strip()
    return out


def pins() -> list[str]:
    """Every distinct name==version of the pinned set (hashes and markers dropped)."""
    seen = {}
    for req in REQUIREMENTS:
        for line in (ROOT / req).read_text().splitlines():
            line = line.split(";")[0].split("\\")[0].strip()
            if "==" in line and not line.startswith(("#", "-")):
                name, version = line.split("==", 1)
                seen[name.strip().lower()] = f"{name.strip()}=={version.strip()}"
    return sorted(seen.values())


def main() -> int:
    allowed = exceptions()
    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp) / "pinned.txt"
        reqs.write_text("\n".join(pins()) + "\n")
        report = Path(tmp) / "audit.json"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip_audit",
                "-r",
                str(reqs),
                "--no-deps",
                "--disable-pip",
                "--progress-spinner",
                "off",
                "--format",
                "json",
                "-o",
                str(report),
            ],
            capture_output=True,
            text=True,
        )
        if not report.exists():
            print(
                f"audit: pip-audit failed: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}", file=sys.stderr
            )
            return 75
        deps = json.loads(report.read_text())["dependencies"]
    skipped = [d["name"] for d in deps if d.get("skip_reason")]
    found = [(d["name"], d["version"], v["id"], v.get("fix_versions", [])) for d in deps for v in d.get("vulns", [])]
    unexcused = [f for f in found if f[2] not in allowed]
    for name, version, vid, fixes in found:
        state = f"excepted: {allowed[vid]}" if vid in allowed else "NOT excepted"
        print(f"audit: {name} {version}: {vid} (fixed in {', '.join(fixes) or 'no release'}) {state}")
    if unexcused:
        print(
            f"audit: {len(unexcused)} known vulnerabilities in the pinned set without a justification in "
            f"{EXCEPTIONS.relative_to(ROOT)}",
            file=sys.stderr,
        )
        return 1
    if skipped:
        print(
            f"audit: the advisory database was unreachable for {len(skipped)} of {len(deps)} pinned packages (e.g. "
            f"{skipped[0]}): "
            "not audited; run `make audit` where PyPI's JSON API is reachable",
            file=sys.stderr,
        )
        return 75
    print(f"audit: {len(deps)} pinned packages, no known vulnerability ({len(found)} excepted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
