"""The one command line every face runs: ``python -m trainpipe.components.<name> …``.

Stdlib only: the KFP face calls it inside the container. The KFP face, the
Airflow operator and the KubernetesPodOperator all build their command here, so
the three can never drift from each other or from the entrypoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any


def settings_to_flags(settings: dict[str, Any]) -> list[str]:
    """``{"label_column": "y", "hidden_units": [64]}`` → ``--label-column y --hidden-units [64]``.

    Unset values (None or "") are left out, so the component's own default applies.
    """
    args: list[str] = []
    for key, value in settings.items():
        if value is None or value == "":
            continue
        args += ["--" + key.replace("_", "-"), value if isinstance(value, str) else json.dumps(value)]
    return args


def component_command(
    name: str,
    settings: dict[str, Any],
    *,
    orchestrator: str,
    run_id: str = "",
    result_path: str | None = None,
    error_record: str | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The full entrypoint command for one component run (``error_record``: where a failure is described)."""
    cmd = [python, "-m", f"trainpipe.components.{name}", "--orchestrator", orchestrator]
    if run_id:
        cmd += ["--run-id", run_id]
    if result_path:
        cmd += ["--result", result_path]
    if error_record:
        cmd += ["--error-record", error_record]
    return cmd + settings_to_flags(settings)


#: Where ``trainpipe run`` asks every step to describe its failure (the step, its one line, its code).
FAILURE_FILE_ENV = "TRAINPIPE_FAILURE_FILE"


@contextlib.contextmanager
def error_record() -> Iterator[tuple[str, tuple[int, ...]]]:
    """Where a step run by a face describes its failure (its ``--error-record``) and the descriptors to hand it
    (``pass_fds``): an open temporary file with no name, as ``/dev/fd/N``. A runner killed outright (an Airflow
    task SIGKILLed while its step checkpoints, then writes its record) leaves no file behind; a folder in the
    temp folder would stay. Where there is no ``/dev/fd``, a temporary folder's file."""
    if not os.path.isdir("/dev/fd"):
        with tempfile.TemporaryDirectory(prefix="trainpipe-") as tmp:
            yield os.path.join(tmp, "error.json"), ()
        return
    with tempfile.TemporaryFile(prefix="trainpipe-error-") as fh:
        yield f"/dev/fd/{fh.fileno()}", (fh.fileno(),)


def note_failure(name: str, code: int, message: str) -> None:
    """Tell ``trainpipe run`` (when it runs this step) which step failed, how, with what code."""
    target = os.environ.get(FAILURE_FILE_ENV)
    if target:
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"component": name, "exit_code": code, "message": message}, fh)
        os.replace(tmp, target)


def stream(cmd: list[str], env: dict[str, str], emit: Any, on_start: Any = None, **popen: Any) -> tuple[int, str]:
    """Run ``cmd``, handing each stderr line to ``emit`` as it comes (stdout is read on a thread, so
    a large result cannot block the step); it gets SIGTERM if this process dies (:mod:`~trainpipe.contract.lifeline`).
    Returns ``(exit code, stdout)``; a failure's line is in the step's error record, not here."""
    import threading

    from trainpipe.contract import warm
    from trainpipe.contract.lifeline import PARENT_ENV, guarded

    # forked by the run's warm host where there is one (trainpipe run's local engines): the libraries it imported
    # once are not imported again; it sends the step SIGTERM when this process dies, as the guard below does
    proc: Any = None
    if set(popen) <= {"pass_fds", "start_new_session"}:
        proc = warm.spawn(cmd, env, stdout=True, stderr=True, text=True, **popen)
    if proc is None:
        # the step dies with whoever runs it (a killed Airflow task, a KFP body): SIGTERM, so it checkpoints
        env = {**env, PARENT_ENV: str(os.getpid())}
        proc = subprocess.Popen(
            guarded(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen
        )
    if on_start is not None:
        on_start(proc)
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    for text in proc.stderr:  # type: ignore[union-attr]
        emit(text)
    code = proc.wait()
    reader.join()
    return code, "".join(chunks)
