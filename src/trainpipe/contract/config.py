"""Config loading with one-line errors, and one parser per format.

Configs are pydantic models that forbid unknown keys: a typo is an error, not a
silently ignored setting. Every failure is an :class:`InputError` whose message
names the field and what was wrong, on one line.

A value a team writes reaches its code as written: JSON text (a flag, a rendered template, a
``.json`` file, what a face carries) is read by the JSON parser, YAML (a ``.yaml`` config, a
profile) by :func:`parse_yaml`, which follows YAML 1.2's core schema as JSON does: ``1e-05`` is a
float, ``010`` is ten, ``yes`` and ``2026-01-01`` are text. PyYAML's own rules (YAML 1.1) read
``1e-05`` as the string ``'1e-05'``, which is how a learning rate once reached a team's function.
"""

from __future__ import annotations

import functools
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
    return describe_errors(exc.errors(), where)


def describe_errors(errors: list[Any], where: str = "config") -> str:
    """pydantic's error records (``ValidationError.errors()``, some left out) as one line."""
    import re

    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown key (no such setting here)"
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


def parse_json(text: str, where: str) -> Any:
    """JSON text as Python values (big integers, exponent floats and key order kept).

    Raises:
        InputError: ``where``, what is wrong and where in the text, on one line.
    """
    try:
        return json.loads(text)
    except ValueError as exc:
        at = getattr(exc, "pos", None)
        near = f" at character {at}" if at is not None else ""
        msg = getattr(exc, "msg", str(exc))
        raise InputError(f"{where}: not JSON ({msg}{near}): {text[:80]!r}") from None


_YAML_CORE = {  # YAML 1.2's core schema, as JSON reads the same values
    "tag:yaml.org,2002:null": (r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    "tag:yaml.org,2002:bool": (r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    "tag:yaml.org,2002:int": (r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    "tag:yaml.org,2002:float": (
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        list("-+0123456789."),
    ),
    "tag:yaml.org,2002:merge": (r"^(?:<<)$", ["<"]),
}


def _yaml_int(loader: Any, node: Any) -> int:
    text = loader.construct_scalar(node)
    digits = text.lstrip("+-")
    sign = -1 if text.startswith("-") else 1
    if digits.startswith("0o"):
        return int(digits[2:], 8)
    if digits.startswith("0x"):
        return int(digits[2:], 16)
    return sign * int(digits, 10)


def _yaml_float(loader: Any, node: Any) -> float:
    text = loader.construct_scalar(node)
    special = text.lower().lstrip("+")
    if special in (".inf", "-.inf", ".nan"):
        return float(special.replace(".", ""))
    return float(text)


def _yaml_bool(loader: Any, node: Any) -> bool:
    return loader.construct_scalar(node).lower() == "true"


@functools.lru_cache(maxsize=1)
def _yaml_classes() -> tuple[type, type]:
    """A loader and a dumper that both resolve plain scalars by YAML 1.2's core schema: what one
    writes unquoted the other reads back as the same type (a string that looks like a number is quoted)."""
    import re

    import yaml

    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        yaml_implicit_resolvers: dict[Any, Any] = {}

    class Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
        yaml_implicit_resolvers: dict[Any, Any] = {}

    for cls in (Loader, Dumper):
        for tag, (pattern, first) in _YAML_CORE.items():
            cls.add_implicit_resolver(tag, re.compile(pattern), first)
    Loader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
    Loader.add_constructor("tag:yaml.org,2002:float", _yaml_float)
    Loader.add_constructor("tag:yaml.org,2002:bool", _yaml_bool)
    return Loader, Dumper


def parse_yaml(text: str) -> Any:
    """YAML text as Python values, plain scalars resolved by YAML 1.2's core schema (as JSON reads them).

    Raises:
        yaml.YAMLError: the text is not YAML (callers turn it into their one line).
    """
    import yaml

    return yaml.load(text, Loader=_yaml_classes()[0])  # noqa: S506 (a safe loader with the core schema's resolvers)


def dump_yaml(data: Any) -> str:
    """YAML that :func:`parse_yaml` reads back to ``data``: key order kept, numbers-as-text quoted."""
    import yaml

    return yaml.dump(data, Dumper=_yaml_classes()[1], sort_keys=False, allow_unicode=True)


def load_file(path: str | os.PathLike[str], what: str = "config file") -> dict[str, Any]:
    """Read a YAML or JSON config file into a dict; ``what`` names the file in messages (with the field
    that named it: ``profile: hardware profile file``).

    Raises:
        InputError: the file is missing, unreadable, not YAML/JSON, or not a mapping.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {str(p)!r} does not exist") from None
    except OSError as exc:
        raise InputError(f"{what} {str(p)!r} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {str(p)!r} is not UTF-8 text (byte {exc.start})") from None
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            data = parse_yaml(text)
    except Exception as exc:  # yaml and json raise many kinds
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{what} {str(p)!r} is not valid YAML/JSON: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{what} {str(p)!r} must hold a mapping of settings, not {type(data).__name__}")
    return data
