"""A model's weights as one safetensors file, written once and shared by name.

``safetensors.torch.save`` builds the whole file in memory before it is written (a second copy of
the weights: 4 GB for a 1B model), and a file written through the page cache costs the kernel a copy
of every page. :func:`write` streams each tensor's own memory to disk around the page cache
(:class:`~trainpipe.training.direct_io.DirectFile`) and hashes the same bytes on a second thread
(hashlib releases the GIL), so the file's sha256 is known when the write ends, without reading it
back. The file is plain safetensors, read by ``safetensors.safe_open``/``load_file`` and by MLflow's
loader alike. The digest's record beside the file is read by the launcher, which imports no torch.

:func:`share` gives a written file a second name (a hard link; a copy only across file systems):
the last checkpoint's weights become the model's, and the model's become the MLflow store's, with
no second write. Files are never changed in place (written under a temporary name and renamed), so
two names of one file stay equal. torch is imported inside the functions that write.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import threading
from pathlib import Path
from typing import Any

from trainpipe.training.direct_io import DirectFile

#: safetensors' names of torch dtypes (by torch's own name).
DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
#: Beside a weights file: its sha256, and the file it was taken of (inode, size, mtime), so a reader trusts
#: it only for that very file.
DIGEST_SUFFIX = ".sha256.json"


def header(tensors: dict[str, Any]) -> bytes:
    """The safetensors header of ``tensors`` in name order (8-byte length, JSON padded to 8 bytes)."""
    entries: dict[str, Any] = {}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        size = t.numel() * t.element_size()
        entries[name] = {
            "dtype": DTYPES[_name(t.dtype)],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def writable(tensors: dict[str, Any]) -> bool:
    """Whether :func:`write` takes these (every value a tensor of a dtype safetensors names)."""
    import torch

    return all(isinstance(t, torch.Tensor) and _name(t.dtype) in DTYPES for t in tensors.values())


def _bytes(t: Any) -> Any:
    """A tensor's bytes as a host buffer, without a copy where it is a contiguous host tensor."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    t = t.contiguous().reshape(-1)
    return (t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)).numpy()


def write(path: Path, tensors: dict[str, Any]) -> str:
    """Write ``tensors`` as a safetensors file at ``path`` (under a temporary name, fsynced, then renamed)
    and record its sha256 beside it (:data:`DIGEST_SUFFIX`).

    Returns:
        The file's sha256 (hex).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    head = header(tensors)
    digest = hashlib.sha256(head)
    chunks: queue.Queue[Any] = queue.Queue(maxsize=4)

    def hash_all() -> None:
        while (chunk := chunks.get()) is not None:
            digest.update(chunk)

    hasher = threading.Thread(target=hash_all, name="trainpipe-weights-sha256", daemon=True)
    hasher.start()
    f = DirectFile(tmp)
    try:
        f.write(head)
        for name in sorted(tensors):
            data = _bytes(tensors[name])
            chunks.put(data)
            f.write(data)
        f.finish()
    finally:
        chunks.put(None)
        hasher.join()
        f.release()
    os.replace(tmp, path)
    sha = digest.hexdigest()
    record_digest(path, sha)
    return sha


def record_digest(path: Path, sha: str) -> None:
    """Keep ``sha`` beside ``path``, valid for the file as it is now."""
    from trainpipe.contract.io import atomic_write_json

    atomic_write_json(Path(f"{path}{DIGEST_SUFFIX}"), {"sha256": sha, "file": _identity(path)})


def recorded_digest(path: Path) -> str | None:
    """The sha256 kept beside ``path`` by :func:`write`, when it is this very file's; else None."""
    try:
        kept = json.loads(Path(f"{path}{DIGEST_SUFFIX}").read_text(encoding="utf-8"))
        return str(kept["sha256"]) if kept.get("file") == _identity(path) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _identity(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def share(src: Path, dest: Path) -> bool:
    """``dest`` becomes another name of ``src`` (atomically replacing it): a hard link, or a copy where the
    two lie on different file systems. Its recorded digest travels with it.

    Returns:
        True when linked, False when copied.
    """
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
        linked = True
    except OSError:
        shutil.copyfile(src, tmp)
        linked = False
    os.replace(tmp, dest)
    sha = recorded_digest(src)
    if sha is not None:
        record_digest(dest, sha)
    return linked


def read_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header (names, dtypes, shapes), read without its data."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        entries = json.loads(fh.read(n))
    entries.pop("__metadata__", None)
    return dict(entries)
