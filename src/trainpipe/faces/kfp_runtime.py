"""What a KFP component body calls inside its container: the same entrypoint a
person would run by hand, as a subprocess. Imports nothing heavy: the body starts the step before it
imports the component's face (its spec's models), so the two load side by side.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: Parameters every face has beside the settings: the orchestrator's run id (in the lineage).
RUN_ID = "run_id"
#: A data-reading face's parameter that puts the snapshot's DVC md5 into the task's cache key.
DATASET_MD5 = "dataset_md5"

#: Left in a task's output by an attempt that failed for good; a retried attempt (KFP's retry policy
#: cannot tell a permanent exit code from a transient one) exits with it at once instead of running again.
FAILED_RECORD = ".trainpipe-failed.json"


def run_face(name: str, values: dict[str, Any], artifacts: Mapping[str, str | None], unset: Sequence[str]) -> Any:
    """What a component function's body does: its step's entrypoint with its settings, then what the
    result puts on the artifacts (the face's ``publish``).

    The settings are read from the function's arguments without the spec: ``artifacts`` maps each
    artifact's parameter to the path setting it fills (None: one the face fills from the result), and
    ``unset`` names the settings whose KFP stand-in (``""``, ``0``) means None again, both written into
    the body when it was compiled (:meth:`~trainpipe.faces.kfp_face.Face.source`). The face itself,
    whose import builds the spec's models, is imported while the step starts.
    """
    from trainpipe.contract.imports import import_face
    from trainpipe.faces.surface import from_kfp_values

    arts = {a: values[a] for a in artifacts}
    if DATASET_MD5 in values:
        check_dataset_hash(arts["data"], values[DATASET_MD5])
    settings: dict[str, Any] = {f: arts[a].path if arts[a] is not None else None for a, f in artifacts.items() if f}
    plain = {k: v for k, v in values.items() if k not in artifacts and k not in (RUN_ID, DATASET_MD5)}
    settings.update(from_kfp_values(plain, frozenset(unset)))
    (main,) = [a for a, f in artifacts.items() if f == "output_dir"]
    faces: list[Any] = []
    failed: list[BaseException] = []

    def load(_proc: Any) -> None:
        try:
            faces.append(import_face(name, "kfp_component").FACE)
        except Exception as exc:  # noqa: BLE001 (raised once the step has ended: it is not left running alone)
            failed.append(exc)

    result = run_entrypoint(name, settings, run_id=values.get(RUN_ID, ""), output=arts[main].path, on_start=load)
    if failed:
        raise failed[0]
    (face,) = faces
    return face.publish(result, arts) if face.publish is not None else None


def run_entrypoint(
    name: str,
    settings: dict[str, Any],
    run_id: str = "",
    output: str | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Run ``python -m trainpipe.components.<name>`` with ``settings`` as flags (None and "" left out);
    ``on_start(process)`` is called once it has started.

    The step's log streams through as it comes. On failure the process exits with the
    entrypoint's own code, so the task fails with the documented code; a permanent failure
    (not 75, not a signal) is recorded in ``output``, and a retried attempt of the same task
    exits with the same code and line without running the step again.

    Returns:
        The component's result JSON.
    """
    from trainpipe.contract.errors import is_retryable_exit
    from trainpipe.faces.command import component_command, error_record, note_failure, stream

    record = os.path.join(output, FAILED_RECORD) if output else None
    if record and os.path.isfile(record):
        with open(record, encoding="utf-8") as fh:
            previous = json.load(fh)
        line = previous.get("message", "")
        print(
            f"trainpipe {name}: an earlier attempt of this task failed for good (exit {previous['exit_code']}), not "
            f"run again: {line}",
            file=sys.stderr,
        )
        note_failure(name, int(previous["exit_code"]), line)
        sys.exit(int(previous["exit_code"]))
    with error_record() as (record_at, fds):  # a file with no name: a killed body leaves none behind
        cmd = component_command(name, settings, orchestrator="kfp", run_id=run_id, error_record=record_at)
        env = dict(os.environ, TRAINPIPE_ORCHESTRATOR="kfp")
        code, out = stream(
            cmd, env, lambda text: (sys.stderr.write(text), sys.stderr.flush()), on_start=on_start, pass_fds=fds
        )
        message = _explain(name, code, record_at) if code != 0 else ""
    if code != 0:
        note_failure(name, code, message)
        if record and not is_retryable_exit(code):
            from trainpipe.contract.io import atomic_write_json

            atomic_write_json(record, {"exit_code": code, "message": message})
        sys.exit(code)
    return json.loads(out.strip().splitlines()[-1])


def check_dataset_hash(snapshot: Any, dataset_md5: str) -> None:
    """The ``dataset_md5`` parameter (part of the task's cache key) must name the snapshot it came with.

    The pipeline passes snapshot_dataset's md5 output as a plain parameter, so KFP's cache
    key of every data-consuming task includes the DVC content hash: new data never hits a
    stale cache. A mismatch means the wiring is wrong: exit 2 (bad input), no retry.
    """
    recorded = (getattr(snapshot, "metadata", None) or {}).get("md5")
    if dataset_md5 and recorded and recorded != dataset_md5:
        print(f"trainpipe: error: dataset_md5: {dataset_md5} is not the snapshot's md5 {recorded}", file=sys.stderr)
        sys.exit(2)


def copy_file(src: str, dest: str) -> None:
    """Copy one file to an output artifact path (for Output[HTML] and the like)."""
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    shutil.copyfile(src, dest)


def log_metrics(metrics_artifact: Any, values: dict[str, Any]) -> None:
    """Log every numeric value onto a KFP ``Output[Metrics]``."""
    for key, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:  # NaN is not JSON
            metrics_artifact.log_metric(key, float(value))


def _explain(name: str, code: int, record_at: str) -> str:
    """A failed step's one line, from its error record (the record's model is imported only for a failure)."""
    from trainpipe.contract.result import ErrorRecord

    return ErrorRecord.explain(name, code, record_at)
