"""Which training function a run calls: ``builtin:<name>`` or a team's ``package.module:function``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from trainpipe.contract.errors import InputError
from trainpipe.contract.imports import import_module
from trainpipe.training import builtin

#: Where each framework's built-in functions are (one function per name in ``builtin.NAMES``).
BUILTIN_MODULES = {"torch": "trainpipe.training.torch.builtin", "tensorflow": "trainpipe.training.tf.builtin"}


def resolve_function(spec: str, framework: str) -> Callable[..., Any]:
    """The training function ``spec`` names (a built-in in ``framework``'s flavour).

    Raises:
        InputError: it cannot be imported, is not callable, or cannot be called as ``f(ctx, config)``.
    """
    if spec.startswith("builtin:"):
        return _builtin(spec, framework)
    module_name, _, func_name = spec.partition(":")
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise InputError(f"train_function: cannot import {module_name!r} for {spec!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 (whatever the team's module raises on import, in one line)
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InputError(f"train_function: importing {module_name!r} raised {type(exc).__name__}: {first}") from None
    func: Any = module
    for part in func_name.split("."):
        func = getattr(func, part, None)
    if func is None or not callable(func):
        raise InputError(f"train_function: {module_name!r} has no function {func_name!r}")
    try:
        inspect.signature(func).bind(object(), {})
    except TypeError:
        raise InputError(
            f"train_function: {spec} takes {inspect.signature(func)}, but trainpipe calls it as f(ctx, config)"
        ) from None
    except ValueError:
        pass  # a builtin without a signature: it will tell when called
    return func


def _builtin(spec: str, framework: str) -> Callable[..., Any]:
    name = spec.split(":", 1)[1]
    if name not in builtin.NAMES:
        known = ", ".join("builtin:" + n for n in builtin.NAMES)
        raise InputError(f"train_function: unknown built-in {spec!r} (built in: {known})")
    return getattr(import_module(BUILTIN_MODULES[framework]), name)
