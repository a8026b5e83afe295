"""The lineage record: one dict of sections that travels with the data.

Each component adds its own section (``source``, ``validation``, ``snapshot``,
``training``, ``profile``, ``evaluation``, ``registration``); the entrypoint adds
``code`` and ``orchestrator``. register_model writes the whole record onto the
model version, so the chain from raw data to model version is never lost.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any, Iterable

from trainpipe.contract.errors import InputError


#: Sections describing the step that runs, not the data: each step sets them anew.
RUN_SECTIONS = ("code", "orchestrator", "image")


def run_sections(orchestrator_name: str | None = None, run_id: str | None = None) -> dict[str, Any]:
    """The sections describing this step's run: code version, orchestrator, image."""
    return {"code": code_version(), "orchestrator": orchestrator(orchestrator_name, run_id), "image": image()}


def merge(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Merge lineage records from several inputs.

    Sections present in more than one record must agree, except the
    :data:`RUN_SECTIONS`, which the current step sets anyway.

    Raises:
        InputError: two inputs disagree about the same section (mixed lineages).
    """
    merged: dict[str, Any] = {}
    for rec in records:
        for key, value in rec.items():
            if key in merged and merged[key] != value and key not in RUN_SECTIONS and key != "steps":
                raise InputError(f"inputs carry conflicting lineage for {key!r}: they come from different runs or data")
            if key == "steps":
                steps = merged.setdefault("steps", [])
                steps.extend(s for s in value if s not in steps)
            else:
                merged[key] = value
    return merged


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str]:
    """The code that runs: trainpipe's version and the git commit of its source, if known.

    ``TRAINPIPE_GIT_COMMIT`` (set in images at build time) wins over asking git.
    """
    from trainpipe import __version__

    commit = os.environ.get("TRAINPIPE_GIT_COMMIT", "")
    if not commit:
        src = Path(__file__).resolve().parent
        try:
            out = subprocess.run(
                ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
            )
            commit = out.stdout.strip() if out.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            commit = ""
    return {"trainpipe": __version__, "git_commit": commit or "unknown"}


def orchestrator(name: str | None = None, run_id: str | None = None) -> dict[str, str]:
    """Who runs this step: arguments win, then ``TRAINPIPE_ORCHESTRATOR`` / ``TRAINPIPE_RUN_ID``."""
    return {
        "name": name or os.environ.get("TRAINPIPE_ORCHESTRATOR", "manual"),
        "run_id": run_id or os.environ.get("TRAINPIPE_RUN_ID", ""),
    }


def image() -> str:
    """The container image this step runs in: ``TRAINPIPE_IMAGE_REF`` (set by trainpipe's
    Dockerfiles at build time), else ``TRAINPIPE_IMAGE``, else ``local``."""
    return os.environ.get("TRAINPIPE_IMAGE_REF") or os.environ.get("TRAINPIPE_IMAGE", "local")


def flatten(lineage: dict[str, Any], prefix: str = "lineage") -> dict[str, str]:
    """Flatten a lineage record to ``lineage.section.key`` strings (for registry tags)."""
    out: dict[str, str] = {}

    def walk(obj: Any, key: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{key}.{k}")
        elif isinstance(obj, (list, tuple)):
            out[key] = ",".join(str(x) for x in obj)
        else:
            out[key] = "" if obj is None else str(obj)

    walk(lineage, prefix)
    return out
