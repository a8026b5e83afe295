"""A dry run: each step resolves what it was given and stops before its work.

With ``TRAINPIPE_DRY_RUN=<folder>`` in its environment (``trainpipe run --dry-run`` sets it for a whole
pipeline), a component's entrypoint reads and checks its settings as it always does, refuses what it
would refuse, then writes what it received to ``<folder>/<component>-<id>.json`` — its settings in the
order they were written, the hardware profile and trusted packages in force, the orchestrator and run,
and what it resolved for its work (train_model: the settings after tune's best are laid over them;
tune_model: the function it searches and what its first trials would train) — and ends with a result
that does nothing: no data read, no training, no MLflow run, nothing registered. Its outputs are
marked complete so the next step runs dry too, on every engine (kfp.local and Airflow run the same
entrypoint). It answers "what does this step get from this config, on this engine" in seconds.

Stdlib and pydantic only: the faces and the entrypoint import it.
"""

from __future__ import annotations

import os
import time
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from trainpipe.contract.io import atomic_write_settings, atomic_write_text
from trainpipe.contract.runtime import profile_label

#: The folder a dry run writes what each step received into; unset, steps do their work.
ENV = "TRAINPIPE_DRY_RUN"
#: The page a dry step leaves where its report would be (the faces copy a report into the UI).
REPORT = "report.html"

R = TypeVar("R", bound=BaseModel)


def folder() -> Path | None:
    """Where this dry run records what the steps received, or None: not a dry run."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


def placeholder(annotation: Any) -> Any:
    """The empty value of a type: what a dry step reports for a figure it did not compute."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        return None if len(args) < len(typing.get_args(annotation)) else placeholder(args[0])
    if origin is typing.Literal:
        return typing.get_args(annotation)[0]
    if origin in (list, tuple, set) or annotation in (list, tuple, set):
        return []
    if origin is dict or annotation is dict:
        return {}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return stub(annotation)
    return {str: "", int: 0, float: 0.0, bool: False}.get(annotation)


def stub(model: type[R], **values: Any) -> R:
    """``model`` with ``values`` and every other field at its default, or empty where it has none."""
    data = {}
    for name, f in model.model_fields.items():
        if name in values:
            data[name] = values[name]
        elif f.is_required():
            data[name] = placeholder(f.annotation)
        else:
            data[name] = f.get_default(call_default_factory=True)
    return model.model_construct(**data)


def report(output_dir: str | os.PathLike[str]) -> str:
    """The page a dry step leaves in ``output_dir`` where its report goes; returns its name."""
    atomic_write_text(
        Path(output_dir) / REPORT, "<p>trainpipe dry run: this step read its settings and did nothing else.</p>"
    )
    return REPORT


def record(name: str, settings: BaseModel, runtime: Any, ns: dict[str, Any], received: dict[str, Any]) -> Path:
    """Write what step ``name`` received into the dry run's folder; returns the file."""
    where = folder()
    assert where is not None, "record() is called in a dry run only"
    where.mkdir(parents=True, exist_ok=True)
    doc = {
        "component": name,
        "orchestrator": ns.get("orchestrator") or os.environ.get("TRAINPIPE_ORCHESTRATOR") or "manual",
        "run_id": ns.get("run_id"),
        "settings": settings.model_dump(mode="json"),
        "hardware_profile": profile_label(runtime.hardware_profile),
        # a step that trusts more than the platform and its setting say (tune_model: its function's package) says so
        "trusted_code": received.get("trusted_code", list(runtime.trusted_code)),
        "policy": runtime.policy.model_dump(mode="json", exclude_defaults=True),
        "received": received,
    }
    path = where / f"{name}-{time.time_ns()}-{os.getpid()}.json"
    atomic_write_settings(path, doc)
    return path


def read(where: str | os.PathLike[str], component: str | None = None) -> list[dict[str, Any]]:
    """What a dry run recorded, oldest first (only ``component``'s steps when given)."""
    import json

    files = sorted(Path(where).glob(f"{component or '*'}-*.json"), key=lambda p: int(p.name.rsplit("-", 2)[1]))
    return [json.loads(p.read_text(encoding="utf-8")) for p in files]


def summarize(where: str | os.PathLike[str]) -> str:
    """What each step of a dry run received, a line each, in the order they ran, and where the records are."""
    lines = []
    for rec in read(where):
        got = rec.get("received") or {}
        said = [f"hardware profile {rec['hardware_profile']}"]
        if got.get("train_function"):
            said.append(f"trains {got['train_function']}")
        if "prices" in got:
            said.append(f"priced in {got['prices']['currency']}" if got["prices"] else "unpriced")
        if rec["trusted_code"]:
            said.append(f"trusts {', '.join(rec['trusted_code'])}")
        lines.append(f"{rec['component']:<17}: {'; '.join(said)}")
    lines.append(f"what each received: {where}")
    return "\n".join(lines)
