"""A component's entrypoint in the test's own process: what ``python -m trainpipe.components.<name>`` does (the
same ``trainpipe.contract.entrypoint.run`` with the component's model, core and dry run), without a new
interpreter importing the world again.

A refusal or a decision is tested this way (the issue's budget: one subprocess case per component proves the
process itself: its exit status, its one line, that nothing was written). What the step prints is captured
at the file-descriptor level, so the ranks and tools it starts are captured too; the environment, the working
folder and the standard streams are put back afterwards, whatever happened.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _entrypoint(name: str) -> dict[str, Any]:
    """What the component's ``__main__`` hands ``main``: its name, settings model, core and dry run."""
    module = importlib.import_module(f"trainpipe.components.{name}.__main__")
    (model,) = [v for k, v in vars(module).items() if k.endswith("Config") and isinstance(v, type)]
    return {"name": module.NAME, "model": model, "core": getattr(module, name), "dry": getattr(module, "dry_run", None)}


#: ``sys.stdout`` and ``sys.stderr`` during a call: they write to file descriptors 1 and 2 by number, so a logging
#: handler a library made during one call (and keeps) writes wherever those descriptors point later, never to a
#: stream that was closed.
_FD_STREAMS = {
    fd: io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", line_buffering=True) for fd in (1, 2)
}


@contextlib.contextmanager
def _captured() -> Iterator[tuple[Path, Path]]:
    """File descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr``) into two files, put back afterwards."""
    with tempfile.TemporaryDirectory(prefix="trainpipe-entry-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        streams = sys.stdout, sys.stderr
        for stream in (*streams, *_FD_STREAMS.values()):
            with contextlib.suppress(Exception):
                stream.flush()
        with open(out, "wb") as fo, open(err, "wb") as fe:
            os.dup2(fo.fileno(), 1)
            os.dup2(fe.fileno(), 2)
            sys.stdout, sys.stderr = _FD_STREAMS[1], _FD_STREAMS[2]
            try:
                yield out, err
            finally:
                for stream in _FD_STREAMS.values():
                    with contextlib.suppress(Exception):
                        stream.flush()
                sys.stdout, sys.stderr = streams
                for fd, copy in saved.items():
                    os.dup2(copy, fd)
                    os.close(copy)


@contextlib.contextmanager
def _environment(env: dict[str, str] | None, cwd: Path | None) -> Iterator[None]:
    """``env`` over the environment and ``cwd`` as the working folder for the call. A ``PYTHONPATH`` in ``env`` (a
    team's package) goes on ``sys.path`` as a new interpreter would put it, and what was imported from it is
    forgotten afterwards, with the caches keyed by a function's name, so the next call imports its own."""
    from trainpipe.contract.lineage import code_version
    from trainpipe.training.config_types import config_model

    before, here, path = dict(os.environ), os.getcwd(), list(sys.path)
    os.environ.update(env or {})
    extra = [p for p in (env or {}).get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra
    modules = set(sys.modules)
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(before)
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            where = getattr(sys.modules[name], "__file__", None) or ""
            if any(where.startswith(p) for p in extra):
                del sys.modules[name]
        config_model.cache_clear()
        code_version.cache_clear()


def call_component(
    name: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run component ``name``'s entrypoint with ``args`` in this process; returns what a subprocess run would."""
    from trainpipe.contract.entrypoint import run

    entry = _entrypoint(name)
    with _environment(env, cwd):
        with _captured() as (out, err):
            try:
                code = run(entry["name"], entry["model"], entry["core"], argv=list(args), dry=entry["dry"])
            except SystemExit as exc:  # argparse's own refusal of a flag (exit 2) or --help (exit 0)
                code = exc.code if isinstance(exc.code, int) else 2
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            said = out.read_text(encoding="utf-8", errors="replace"), err.read_text(encoding="utf-8", errors="replace")
    return subprocess.CompletedProcess([sys.executable, "-m", f"trainpipe.components.{name}", *args], code, *said)
