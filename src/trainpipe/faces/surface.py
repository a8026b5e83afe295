"""How a component's settings cross the KFP boundary, derived from its spec and written once.

A setting's name, type, default, bounds and description live in the component's spec
(``<Name>Params``, pydantic). The KFP face's parameters and the pipeline's are generated from it
through :func:`kfp_params`; what KFP cannot carry as the spec says is mapped here:

- unset: KFP parameters cannot be None (kfp.local rejects it), so a default of None is the type's
  empty value (:data:`UNSET`) on KFP, and the entrypoint treats an empty value as unset again;
- an open mapping (``dict[str, Any]``, such as a team's ``train_config``) crosses as JSON text: KFP
  carries a dict as a protobuf Struct, whose numbers are all floats, so ``hidden: 24`` would reach
  the team's function as ``24.0``. As text it arrives with the types it was given, in the order it
  was written. A pipeline passes it as it would any dict (:func:`to_kfp_text`): a constant dict is
  written as JSON at compile time; a pipeline parameter inside it becomes a typed slot in that text,
  which KFP fills when the task runs and :func:`from_kfp` reads back as the parameter's type;
- a closed choice (``Literal``) is its values' type, a nested settings model a dict.

Imports pydantic only: the compiler and the KFP component bodies (inside the container) read it.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any

if typing.TYPE_CHECKING:
    from pydantic import BaseModel

#: What stands for "unset" (a spec default of None) on KFP, by the parameter's type.
UNSET: dict[type, Any] = {int: 0, float: 0.0, str: "", dict: {}, list: []}
#: The default of a setting that has none (the face's parameter is required).
REQUIRED = object()


@dataclass(frozen=True)
class KfpParam:
    """One setting as a KFP parameter."""

    name: str
    type: type  # str, int, float, bool, dict or list
    default: Any  # REQUIRED when the spec gives none
    json_text: bool  # an open mapping, carried as JSON text
    description: str


def _options(annotation: Any) -> list[Any]:
    """The annotation's alternatives, None left out (``int | None`` -> ``[int]``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _is_open(annotation: Any) -> bool:
    """``dict[str, Any]`` (or a bare dict): values of any type, which a Struct would make floats."""
    if annotation is dict:
        return True
    args = typing.get_args(annotation)
    return typing.get_origin(annotation) is dict and len(args) == 2 and args[1] is Any


def kfp_type(annotation: Any) -> tuple[type, bool]:
    """The KFP parameter type a spec field's annotation becomes, and whether it travels as JSON text."""
    from pydantic import BaseModel  # here, not at import: a task's body reads values without pydantic

    options = _options(annotation)
    if len(options) != 1:
        raise TypeError(f"a setting of type {annotation} has no single KFP parameter type")
    a = options[0]
    origin = typing.get_origin(a) or a
    args = typing.get_args(a)
    if _is_open(a) or (
        origin in (dict, list) and args and isinstance(args[-1], type) and issubclass(args[-1], BaseModel)
    ):
        return str, True  # values of any type, or typed records: JSON text keeps their numbers' types
    if origin is typing.Literal:
        return type(typing.get_args(a)[0]), False
    if isinstance(origin, type) and issubclass(origin, BaseModel):
        return dict, False
    if origin in (dict, list, str, int, float, bool):
        return origin, False
    raise TypeError(f"a setting of type {annotation} has no KFP parameter type")


def kfp_value(value: Any, param: KfpParam) -> Any:
    """A setting's value (a spec default or a config's value) as its KFP argument."""
    if value is None:
        if param.type not in UNSET:
            raise TypeError(f"{param.name}: a {param.type.__name__} setting cannot be unset on KFP")
        return UNSET[param.type]
    from pydantic import BaseModel

    if isinstance(value, (BaseModel, list, dict)):
        from pydantic_core import to_jsonable_python

        value = to_jsonable_python(value)
    if param.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)  # a whole-number default of a float setting
    return json.dumps(value) if param.json_text else value  # in the order written: a team's keys are not sorted


def kfp_params(model: type[BaseModel], names: typing.Iterable[str] | None = None) -> list[KfpParam]:
    """The KFP parameters of a settings model's fields (all of them, or ``names``), in its order."""
    wanted = set(names) if names is not None else None
    out = []
    for name, field in model.model_fields.items():
        if wanted is not None and name not in wanted:
            continue
        kind, json_text = kfp_type(field.annotation)
        param = KfpParam(name, kind, REQUIRED, json_text, (field.description or "").strip())
        if not field.is_required():
            param = KfpParam(
                name, kind, kfp_value(field.get_default(call_default_factory=True), param), json_text, param.description
            )
        out.append(param)
    return out


#: The key of a pipeline parameter's slot inside a JSON-text setting: ``{SLOT: "Float", "text": "..."}``.
SLOT = "$kfp_parameter"
#: The KFP parameter types a slot can carry, and how their text is read back.
SLOT_TYPES = ("String", "Integer", "Float", "Boolean")


def is_channel(value: Any) -> bool:
    """Whether a value is a KFP pipeline channel (a pipeline parameter, a task's output)."""
    return hasattr(value, "channel_type") and hasattr(value, "pattern")


def to_kfp_text(value: Any, name: str) -> tuple[Any, frozenset[str]]:
    """A JSON-text setting as a pipeline passes it (a dict or list, pipeline parameters inside allowed)
    as the text KFP carries; text and a whole pipeline parameter go on as they are.

    Returns:
        The argument, and the top-level keys that hold a pipeline parameter (known when the task runs).

    Raises:
        TypeError: a pipeline parameter of a type JSON text cannot hold (one line: what to write instead).
    """
    if not isinstance(value, (dict, list)):
        return value, frozenset()
    late: set[str] = set()

    def slot(v: Any, top: str | None) -> Any:
        if is_channel(v):
            kind = str(v.channel_type)
            if kind not in SLOT_TYPES:
                raise TypeError(
                    f"{name}: the pipeline parameter {v.name!r} is a {kind}; inside {name} a parameter must be a str, "
                    f"int, float or bool (pass the whole {name} as a str parameter holding JSON instead)"
                )
            if top is not None:
                late.add(top)
            return {SLOT: kind, "text": str(v)}  # KFP puts the value's text in place of the placeholder
        if isinstance(v, dict):
            return {k: slot(x, k if top is None else top) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [slot(x, top) for x in v]
        return v

    return json.dumps(slot(value, None)), frozenset(late)


def _read_slot(kind: str, text: str) -> Any:
    if kind == "Integer":  # KFP carries an int parameter as a double: exact up to 2**53
        number = float(text) if any(c in text for c in ".eE") else int(text)
        return int(number)
    if kind == "Float":
        return float(text)
    if kind == "Boolean":
        return text.strip().lower() in ("true", "1")
    return text


def _filled(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {SLOT, "text"} and value[SLOT] in SLOT_TYPES:
            return _read_slot(value[SLOT], str(value["text"]))
        return {k: _filled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v) for v in value]
    return value


#: A value of each slot's type, for checking at compile time what a parameter will fill.
_STANDINS = {"String": "", "Integer": 0, "Float": 0.0, "Boolean": False}


def standins(value: Any) -> Any:
    """Read-back JSON text (:func:`to_kfp_text`'s) with each pipeline parameter's slot replaced by a value of
    its type: what a check at compile time sees of a value KFP fills when the task runs (its type, not
    the value)."""
    if isinstance(value, dict):
        if set(value) == {SLOT, "text"} and value[SLOT] in SLOT_TYPES:
            return _STANDINS[value[SLOT]]
        return {k: standins(v) for k, v in value.items()}
    if isinstance(value, list):
        return [standins(v) for v in value]
    return value


def from_kfp_text(text: str) -> str:
    """JSON text KFP delivered, its pipeline parameters' slots read back as their types (text that is not
    JSON goes on unchanged: the entrypoint names the setting and what is wrong)."""
    if SLOT not in text:
        return text
    try:
        return json.dumps(_filled(json.loads(text)))
    except ValueError:
        return text


def from_kfp(values: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """KFP arguments as the component's settings: an unset stand-in is None again where the spec's
    default is None (so the entrypoint leaves the setting out); JSON text stays text (the
    entrypoint reads it as JSON, with the types it was written with), its pipeline parameters' slots
    filled in."""
    return from_kfp_values(values, unset_names(model, values))


def unset_names(model: type[BaseModel], names: typing.Iterable[str] | None = None) -> list[str]:
    """The settings (of ``names``, or all) whose KFP stand-in means None: optional, None by default."""
    fields = model.model_fields
    return [
        n
        for n in (fields if names is None else names)
        if not fields[n].is_required() and fields[n].get_default(call_default_factory=True) is None
    ]


def from_kfp_values(values: dict[str, Any], unset: typing.Collection[str]) -> dict[str, Any]:
    """:func:`from_kfp` with the settings whose stand-in means None named (``unset``): what a component
    function's body does in its container, where the spec is not imported."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        value = from_kfp_text(value) if isinstance(value, str) else value
        out[name] = None if name in unset and value == UNSET.get(type(value), object()) else value
    return out
