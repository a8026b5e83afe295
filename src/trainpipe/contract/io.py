"""Atomic, idempotent file output and content hashing.

Every output is written to a temporary path beside its destination, fsynced and
renamed into place, so a reader never sees a partial file: a step killed while
writing leaves the previous state (or nothing), never half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainpipe.contract.progress import Progress

_CHUNK = 1 << 20


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a folder, so a rename inside it is durable (a no-op where the file system refuses)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename).

    Args:
        path: Destination file; its parent directory is created.
        data: The bytes to write.

    Returns:
        The destination path.
    """
    return atomic_write_chunks(path, (data,))


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc; no race with threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: What a step's outputs never grant (the default of the policy's ``output_umask``): files 0640, folders 0750, so a
#: model, a checkpoint or a run's copy of the data is read by its owner and group, not every user of the machine.
OUTPUT_UMASK = "027"


def restrict_umask(output_umask: str = OUTPUT_UMASK) -> int:
    """Set the process's umask so what it writes from now on, and what every process it starts writes (ranks,
    DVC, git), grants no more than ``output_umask`` allows; a stricter umask already set stays. Returns the umask
    it replaced, for the caller to put back.

    Args:
        output_umask: Octal text (``"027"``; ``"022"`` lets every user read, ``"077"`` only the owner).
    """
    wanted = int(output_umask, 8)
    previous = os.umask(0o077)
    os.umask(previous | wanted)
    return previous


def current_umask() -> int:
    """The process's umask, left as it is."""
    return _umask()


def file_mode() -> int:
    """The mode a plain ``open()`` would give a new file (0666 less the umask): ``mkstemp`` makes 0600, which
    other users of a shared volume (a step run as another user, a server reading the artifacts) cannot read."""
    return 0o666 & ~_umask()


def folder_mode() -> int:
    """The mode a plain ``mkdir()`` would give a new folder (0777 less the umask): ``mkdtemp`` makes 0700."""
    return 0o777 & ~_umask()


def atomic_write_chunks(path: str | os.PathLike[str], chunks: Iterable[bytes], durable: bool = True) -> Path:
    """Write the concatenated ``chunks`` to ``path`` atomically (temp file, fsync, rename).

    A process killed part way leaves at most a hidden ``.<name>.*.tmp`` beside the
    destination, never a partial file under the destination's name. ``durable=False`` leaves out
    the fsyncs (a reader still sees the old file or the whole new one; a machine that crashes
    may lose it): for a file rewritten often whose content something durable also holds.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(dest.parent)
    return dest


def atomic_write_text(path: str | os.PathLike[str], text: str, durable: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (``durable``: see :func:`atomic_write_chunks`)."""
    return atomic_write_chunks(path, (text.encode("utf-8"),), durable=durable)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented, key-sorted JSON atomically (stable bytes for equal content)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


#: Where a runner hands its step an open file by number (``pass_fds``) rather than a path in a folder.
_DESCRIPTORS = ("/dev/fd/", "/proc/self/fd/")


def write_record(path: str | os.PathLike[str], obj: Any) -> None:
    """A record a runner reads once this process has exited (an error record): atomically to a path, in place
    to a descriptor the runner handed down (``/dev/fd/N``: a file with no name, which no folder keeps)."""
    if str(path).startswith(_DESCRIPTORS):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
        return
    atomic_write_json(path, obj)


def atomic_write_settings(path: str | os.PathLike[str], settings: Any, **dump: Any) -> Path:
    """Settings another process reads back (a rank, a node, a trial) as JSON in their own key order, so a
    team's ``train_config`` arrives as it was written: not sorted, big integers and exponents exact.

    Args:
        path: Where.
        settings: A pydantic model (``dump`` goes to its ``model_dump_json``) or a plain mapping.
    """
    if hasattr(settings, "model_dump_json"):
        text = settings.model_dump_json(indent=2, **dump)
    else:
        text = json.dumps(settings, indent=2, ensure_ascii=False)
    return atomic_write_text(path, text + "\n")


def atomic_copy(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Copy a file atomically: a reader of ``dest`` sees the old file or the whole new one."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        os.chmod(tmp, file_mode())
        shutil.copyfile(src, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(dest.parent)
    return dest


def file_digest(path: str | os.PathLike[str], algorithm: str = "md5", progress: Any = None) -> str:
    """Hex digest of a file's bytes (md5 by default, the hash DVC uses); ``progress`` (a
    :class:`trainpipe.contract.progress.Progress` in MB) advances as it reads."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            if progress is not None:
                progress.update(progress.done + len(chunk) / 2**20)
            h.update(chunk)
    return h.hexdigest()


def dataset_digest(path: str | os.PathLike[str], progress_for: str | None = None) -> str:
    """The content hash DVC gives a dataset: a file's md5, or a folder's ``.dir`` hash (the md5 of
    the sorted JSON list of its files' relative paths and md5s), so a validated folder's hash is
    the one its snapshot records. ``progress_for`` names who reports progress in the log while a
    large dataset is read (a line every ``TRAINPIPE_PROGRESS_EVERY_S``; none for a quick one)."""
    p = Path(path)
    files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
    progress = None
    if progress_for:
        progress = Progress(progress_for, sum(f.stat().st_size for f in files) / 2**20, "MB")
    if p.is_file():
        digest = file_digest(p, progress=progress)
    else:
        entries = sorted(
            ({"md5": file_digest(f, progress=progress), "relpath": f.relative_to(p).as_posix()} for f in files),
            key=lambda e: e["relpath"],
        )
        digest = hashlib.md5(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest() + ".dir"
    if progress is not None:
        progress.finish()
    return digest


def copy_tree_atomic(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Place a folder's files at ``dest`` (hard links where possible): written under a hidden name,
    then renamed, so a reader sees the old folder or the whole new one."""
    src, dest = Path(src), Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for f in sorted(src.rglob("*")):
        if f.is_file():
            link_or_copy(f, tmp / f.relative_to(src))
    old = dest.with_name(f".{dest.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)
    fsync_dir(dest.parent)
    return dest


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file written by :func:`atomic_write_json`."""
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def link_or_copy(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Place ``src`` at ``dest`` by hard link when possible, else by atomic copy.

    Artifacts are immutable (every write replaces, never edits in place), so a
    hard link is a safe zero-copy way to hand a large file to the next step.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        return atomic_copy(src, dest)
    os.replace(tmp, dest)
    return dest
