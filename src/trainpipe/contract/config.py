"""Config loading with one-line errors.

Configs are pydantic models that forbid unknown keys: a typo is an error, not a
silently ignored setting. Every failure is an :class:`InputError` whose message
names the field and what was wrong, on one line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from trainpipe.contract.errors import InputError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every config: unknown keys are rejected, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def describe_validation_error(exc: ValidationError, where: str = "config") -> str:
    """Render a pydantic error as one line naming each field and what was wrong.

    A rule that spans fields (a model validator) says which field it is about by starting its
    message with ``field: ``; that field is named as if the error were its own.
    """
    import re

    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown key (not a setting of this component)"
        if not loc:
            named = re.match(r"^([A-Za-z_][\w.]*(?:, [A-Za-z_][\w.]*)*): (.*)$", msg)
            loc, msg = (named.group(1), named.group(2)) if named else ("(root)", msg)
        parts.append(f"{where} field {loc!r}: {msg}")
    return "; ".join(parts)


def build(model: type[M], data: Mapping[str, Any], where: str = "config") -> M:
    """Validate ``data`` into ``model``.

    Raises:
        InputError: one line naming every bad field.
    """
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise InputError(describe_validation_error(exc, where)) from None


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML or JSON config file into a dict.

    Raises:
        InputError: the file is missing, unreadable, not YAML/JSON, or not a mapping.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"config file {str(p)!r} does not exist") from None
    except OSError as exc:
        raise InputError(f"config file {str(p)!r} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"config file {str(p)!r} is not UTF-8 text (byte {exc.start})") from None
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # yaml and json raise many kinds
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"config file {str(p)!r} is not valid YAML/JSON: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"config file {str(p)!r} must hold a mapping of settings, not {type(data).__name__}")
    return data
