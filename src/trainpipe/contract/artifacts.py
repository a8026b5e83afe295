"""Artifact directories and their completion marker.

Every component output is a directory. Its marker file, ``trainpipe.json``
(component, result, lineage), is written last and atomically; it is removed
first when a step starts writing. A directory without a marker is incomplete:
the next step refuses it, so a step killed while writing is never read as done.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json, read_json
from trainpipe.contract.layout import MARKER


@dataclass(frozen=True)
class ArtifactRef:
    """A completed artifact directory as the next step sees it."""

    path: Path
    component: str
    result: dict[str, Any] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)


def begin_output(path: str | os.PathLike[str]) -> Path:
    """Prepare an output directory: create it and drop any stale completion marker."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InputError(f"output path {str(out)!r} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).unlink(missing_ok=True)
    return out


def finish_output(
    path: str | os.PathLike[str], component: str, result: dict[str, Any], lineage: dict[str, Any]
) -> None:
    """Mark an output directory complete (the last write of a step)."""
    atomic_write_json(Path(path) / MARKER, {"component": component, "result": result, "lineage": lineage})


def read_artifact(path: str | os.PathLike[str], field_name: str) -> ArtifactRef:
    """Open a completed artifact directory.

    Args:
        path: The artifact directory.
        field_name: The input's name, for the error message.

    Returns:
        The artifact with the producing step's result and lineage.

    Raises:
        InputError: the path is missing or the producing step did not finish.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"input {field_name!r}: {str(p)!r} does not exist")
    marker = p / MARKER
    if not p.is_dir() or not marker.is_file():
        raise InputError(
            f"input {field_name!r}: {str(p)!r} is not a completed trainpipe artifact (no {MARKER}; did the producing "
            "step finish?)"
        )
    try:
        doc = read_json(marker)
    except ValueError as exc:
        raise InputError(f"input {field_name!r}: {MARKER} is not valid JSON: {exc}") from None
    return ArtifactRef(
        path=p, component=doc.get("component", ""), result=doc.get("result", {}), lineage=doc.get("lineage", {})
    )
