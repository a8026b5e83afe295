"""Artifact directories and their completion marker.

Every component output is a directory. Its marker file, ``trainpipe.json``
(component, result, lineage), is written last and atomically; it is removed
first when a step starts writing. A directory without a marker is incomplete:
the next step refuses it, so a step killed while writing is never read as done.
"""

from __future__ import annotations

import errno
import os
import tempfile
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


def begin_output(path: str | os.PathLike[str], field_name: str = "output_dir") -> Path:
    """Prepare an output directory: create it, drop any stale completion marker, and find out now that this process
    can write in it (a container's user often cannot write a mounted folder), not halfway through the step.

    Raises:
        InputError: the path is a file, or this process may not write there (one line naming ``field_name``).
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InputError(f"output path {str(out)!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).unlink(missing_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise InputError(
            f"{field_name}: {str(out)!r} cannot be written by this process (uid {os.getuid()}): {exc.strerror}; make "
            "it writable by that user (trainpipe's images run as 10001)"
        ) from None
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
