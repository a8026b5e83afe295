"""A training function's typed config: the pydantic model it declares for ``config``, and the check of a
``train_config`` against it, where the config is written.

A team function may annotate its config parameter with a pydantic model::

    class TrainConfig(BaseModel):
        learning_rate: float = 1e-3
        hidden: list[int]

    def train(ctx, config: TrainConfig): ...

Then every ``train_config`` for it is checked against the model before anything runs (the CLI, a
DAG's import, a KFP compile, before a Slurm job is queued, before a study's first trial), a
misspelled or unknown key, a wrong type or a missing key refused in one line, and the function is
called with the model's instance. The check is strict and reads the config as JSON: a value arrives
as written or is refused, never coerced on the way (``"0.001"`` is not a float).

Finding the model imports as little as it can: the function's module is read, not imported, and a
model imported there from another module (``from mypkg.config import TrainConfig``) is imported from
that module alone, so a DAG file that names ``mypkg.train:train`` never imports torch to check its
config. A model defined beside the function is found by importing the function's module. Where the
function's package is not installed (a scheduler that only queues pods), nothing can be checked
there, and the step checks it when it runs. Imports pydantic only.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trainpipe.contract.errors import InputError
from trainpipe.contract.imports import import_module

#: The parameter a function's config is passed as (else its second positional parameter).
CONFIG_PARAM = "config"


def _as_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation names (``Model`` or ``Model | None``), else None (a dict: untyped)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = options[0] if len(options) == 1 else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _config_parameter(params: list[Any], name: Callable[[Any], str]) -> Any:
    """The config parameter among a function's parameters: named ``config``, else the second."""
    for p in params:
        if name(p) == CONFIG_PARAM:
            return p
    return params[1] if len(params) > 1 else None


def model_of_function(func: Callable[..., Any]) -> type[BaseModel] | None:
    """The model a function (already imported) declares for its config, else None."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    param = _config_parameter(params, lambda p: p.name)
    if param is None or param.annotation is inspect.Parameter.empty:
        return None
    annotation = param.annotation
    if isinstance(annotation, str):  # ``from __future__ import annotations``
        try:
            annotation = typing.get_type_hints(func).get(param.name)
        except Exception:  # noqa: BLE001 (a hint that cannot be resolved declares nothing we can check)
            return None
    return _as_model(annotation)


def _import(module: str, spec: str) -> Any:
    try:
        return import_module(module)
    except ImportError as exc:
        raise InputError(f"train_function: cannot import {module!r} for {spec!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 (whatever the team's module raises on import, in one line)
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InputError(f"train_function: importing {module!r} raised {type(exc).__name__}: {first}") from None


def _absolute(module: str, level: int, package: str) -> str:
    """``from .config import X`` inside ``package`` as an absolute module name."""
    if not level:
        return module
    base = package.split(".")
    base = base[: len(base) - level + 1] if level > 1 else base
    return ".".join([*base, module] if module else base)


def _from_source(spec: str) -> type[BaseModel] | None | bool:
    """The model found by reading the function's module: a model, None (untyped), or True when only
    importing the module can tell (a model defined beside the function, an annotation of another shape)."""
    module_name, _, func_name = spec.partition(":")
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None  # the package is not installed here: the step checks when it runs
    if found is None or not found.origin or not found.origin.endswith(".py") or "." in func_name:
        return None if found is None else True
    try:
        tree = ast.parse(Path(found.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return True
    funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func_name]
    if not funcs:
        return True  # assigned or imported under that name: importing tells
    args = funcs[-1].args
    param = _config_parameter([*args.posonlyargs, *args.args], lambda a: a.arg)
    if param is None or param.annotation is None:
        return None
    node = param.annotation
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return True
    if not isinstance(node, ast.Name):
        return True
    package = module_name if found.submodule_search_locations else module_name.rpartition(".")[0]
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == node.id:
                    source = _absolute(stmt.module or "", stmt.level, package)
                    value = getattr(_import(source, spec), alias.name, None)
                    return _as_model(value) if value is not None else True
    if node.id in ("dict", "Dict", "Mapping", "Any", "MutableMapping"):
        return None
    return True


class UncheckedConfigWarning(UserWarning):
    """A team's ``train_config`` could not be checked where it was written (its package is not importable there);
    train_model checks it when its step runs."""


def importable(spec: str) -> bool:
    """Whether a training function's module can be found here without importing it (a built-in always)."""
    if spec.startswith("builtin:"):
        return True
    try:
        return importlib.util.find_spec(spec.partition(":")[0]) is not None
    except (ImportError, ValueError):
        return False


def unchecked(spec: str, where: str) -> str:
    """The one line saying a team function's config was not checked ``where``, because it is not importable there."""
    return (
        f"train_function {spec!r} cannot be imported {where}, so the config given to it (train_config, tune's "
        "space) was not checked; train_model checks it when its step runs"
    )


@functools.lru_cache(maxsize=64)
def config_model(spec: str) -> type[BaseModel] | None:
    """The pydantic model the training function ``spec`` declares for its config, else None.

    Raises:
        InputError: the module that must be imported to find it cannot be, in one line.
    """
    if spec.startswith("builtin:"):
        from trainpipe.training.builtin import BuiltinConfig

        return BuiltinConfig
    found = _from_source(spec)
    if found is not True:
        return found if isinstance(found, type) else None
    module_name, _, func_name = spec.partition(":")
    func: Any = _import(module_name, spec)
    for part in func_name.split("."):
        func = getattr(func, part, None)
    return model_of_function(func) if callable(func) else None


def accepted_keys(model: type[BaseModel]) -> set[str] | None:
    """The keys a model takes (its fields and their aliases), or None where it takes any."""
    if model.model_config.get("extra") == "allow":
        return None
    keys = set()
    for name, f in model.model_fields.items():
        keys.add(name)
        for alias in (f.alias, f.validation_alias):
            if isinstance(alias, str):
                keys.add(alias)
    return keys


def _line(where: str, err: Any) -> str:
    """One pydantic error as ``train_config.<key>: what was wrong (given ...)``."""
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if not loc:  # a rule of the model that names its field first ("hidden: ...")
        named = re.match(r"^([A-Za-z_]\w*): (.*)$", msg)
        loc, msg = (named.group(1), named.group(2)) if named else ("", msg)
    if err.get("type") == "missing":
        msg = "missing (a required key of the config)"
    elif "input" in err and not isinstance(err["input"], (dict, list)) and err.get("type") != "value_error":
        msg += f" (given {err['input']!r:.60})"
    return f"{where}.{loc}: {msg}" if loc else f"{where}: {msg}"


def validate(
    model: type[BaseModel],
    config: Mapping[str, Any],
    where: str = "train_config",
    ignore: frozenset[str] = frozenset(),
    typed: frozenset[str] = frozenset(),
) -> BaseModel | None:
    """``config`` as the model's instance: strict, read as JSON, unknown keys refused even where the
    model would ignore them (an unknown key is a typo until the model says it allows extras).

    Args:
        ignore: keys whose values are not known yet (a template): their errors are left out, and no
            instance is returned.
        typed: keys whose values stand in for one of their type (a pipeline parameter): only an error of
            the wrong type is kept (a bound or a pattern is the value's), and no instance is returned.

    Raises:
        InputError: one line naming each bad key (``train_config.<key>: ...``) and the model.
    """
    accepted = accepted_keys(model)
    problems = []
    if accepted is not None:
        takes = ", ".join(sorted(accepted)) or "no keys"
        problems += [f"{where}.{k}: unknown key ({model.__name__} takes {takes})" for k in config if k not in accepted]
    known = {k: v for k, v in config.items() if accepted is None or k in accepted}
    instance = None
    try:
        instance = model.model_validate_json(json.dumps(known, allow_nan=False), strict=True)
    except ValidationError as exc:
        problems += [_line(where, _as_parameter(e, typed)) for e in exc.errors() if _known(model, e, ignore, typed)]
    except ValueError as exc:  # NaN or infinity, which JSON cannot carry
        problems.append(f"{where}: {exc}")
    if problems:
        raise InputError("; ".join(problems))
    return instance if not (ignore or typed) else None


def _as_parameter(error: Any, typed: frozenset[str]) -> Any:
    """An error about a typed key's own value (a pipeline parameter's stand-in) names the parameter's type,
    not the stand-in."""
    loc: tuple[Any, ...] = tuple(error.get("loc") or ())
    if len(loc) != 1 or str(loc[0]) not in typed or isinstance(error.get("input"), (dict, list)):
        return error
    kind = type(error.get("input")).__name__
    return {
        **{k: v for k, v in error.items() if k != "input"},
        "msg": f"{error['msg']} (given a {kind} pipeline parameter)",
    }


def _known(model: type[BaseModel], error: Any, ignore: frozenset[str], typed: frozenset[str]) -> bool:
    """Whether a validation error is about what is known of the value now (see :func:`validate`): for a
    typed key, a value of the wrong type, or of a type none of its field's literal choices has."""
    key = str(error["loc"][0]) if error.get("loc") else None
    if key in ignore:
        return False
    if key not in typed or str(error.get("type", "")).endswith("_type"):
        return True
    if error.get("type") != "literal_error" or len(error["loc"]) != 1 or key not in model.model_fields:
        return False
    choices = [c for option in _options(model.model_fields[key].annotation) for c in typing.get_args(option)]
    return not any(type(c) is type(error.get("input")) for c in choices)


def _options(annotation: Any) -> list[Any]:
    """An annotation's alternatives (``Literal[...] | None`` -> its Literal and None)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


def check(
    spec: str,
    config: Mapping[str, Any],
    where: str = "train_config",
    ignore: frozenset[str] = frozenset(),
    typed: frozenset[str] = frozenset(),
) -> None:
    """Refuse ``config`` in one line where it does not fit the model ``spec`` declares (nothing to check
    for an untyped function, or one that is not installed here).

    Args:
        ignore: keys whose values are not known yet (a template): only their names are checked.
        typed: keys whose values are known by type only (a pipeline parameter, given as a value of its
            type): their names and types are checked.

    Raises:
        InputError: a bad key or value, or a module that must be imported and cannot be.
    """
    model = config_model(spec)
    if model is not None:
        validate(model, config, where, ignore, typed)


def argument(func: Callable[..., Any], config: Mapping[str, Any], spec: str) -> Any:
    """What the function is called with: its model's instance where it declares one, else the dict."""
    model = model_of_function(func)
    if model is None:
        return dict(config)
    instance = validate(model, config)
    assert instance is not None
    return instance
