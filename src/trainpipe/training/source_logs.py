"""What a team's training function logs each epoch, read from its source before it runs.

A tuning study reads an objective of the function's own (``ctx.log(val_loss=...)``) from each epoch's
line, and the median pruner reads its first objective there. Where the function's source says for
certain every name its ``ctx.log`` calls can record, an objective it never logs is refused when the
settings are read, not at the first trial's first epoch end. The module is read, not imported, as
:mod:`trainpipe.training.config_types` reads it to find the function's config model.

Certain means: the function is defined once, undecorated, at the top of its module, and its ``ctx`` (its
first parameter) is used only as ``ctx.<method>(...)`` or ``ctx.<attribute>``, every ``ctx.log`` call naming
its values with literal keywords (no ``**values``, no positional dict). A ``ctx`` handed to a helper, kept
under another name, or reached through ``ctx.metrics`` makes the names uncertain: then nothing is said
before the function runs, and its first epoch tells. Imports nothing beyond the standard library.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

#: ``ctx`` attributes through which a value can be recorded other than ``ctx.log(...)``.
RECORDERS = ("metrics", "loop")
#: Calls that can hand ``ctx`` on without naming it.
ESCAPES = ("locals", "vars", "eval", "exec", "globals")


def epoch_logs(spec: str) -> tuple[str, ...] | None:
    """Every name the function ``spec`` (``module:function``) can log each epoch, sorted; ``()`` when it
    logs nothing; None when its source does not say for certain (or cannot be read here)."""
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name.isidentifier():
        return None
    try:
        found = importlib.util.find_spec(module_name)
    except Exception:  # noqa: BLE001 (not installed, or its package raised on import: the function's run tells)
        return None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    origin = Path(found.origin)
    try:
        tree = _parsed(str(origin), origin.stat().st_mtime_ns)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    func = _the_definition(tree, func_name)
    if func is None:
        return None
    params = [*func.args.posonlyargs, *func.args.args]
    if not params:
        return None
    names = _logged(func, params[0].arg)
    return None if names is None else tuple(sorted(names))


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"))


def _the_definition(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The module's one undecorated top-level ``def name``, where nothing else in the module binds ``name``."""
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if len(defs) != 1 or defs[0].decorator_list:
        return None
    for node in ast.walk(tree):
        if node is defs[0]:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return None
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return None
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.partition(".")[0]) == name or a.name == "*" for a in node.names
        ):
            return None
    return defs[0]


def _logged(func: ast.FunctionDef | ast.AsyncFunctionDef, ctx: str) -> set[str] | None:
    """The keyword names of every ``ctx.log`` call in the function (nested functions included), or None
    where ``ctx`` is used in a way that could record other names."""
    parent: dict[ast.AST, ast.AST] = {}
    body = [*func.body, *func.args.defaults, *func.args.kw_defaults]
    for stmt in body:
        if stmt is None:
            continue
        for node in ast.walk(stmt):
            for child in ast.iter_child_nodes(node):
                parent[child] = node
    names: set[str] = set()
    for stmt in body:
        if stmt is None:
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ESCAPES:
                return None
            if not (isinstance(node, ast.Name) and node.id == ctx):
                continue  # (a nested function's own parameter of that name is read like ctx: it can only add names)
            attribute = parent.get(node)
            if not isinstance(node.ctx, ast.Load) or not isinstance(attribute, ast.Attribute):
                return None  # rebound, or handed on (a helper's argument, another name, a container)
            if attribute.attr.startswith("_") or attribute.attr in RECORDERS:
                return None
            if attribute.attr != "log":
                continue
            call = parent.get(attribute)
            if not isinstance(call, ast.Call) or call.func is not attribute or call.args:
                return None  # ctx.log kept or passed around, or given a positional value
            for keyword in call.keywords:
                if keyword.arg is None:
                    return None  # ctx.log(**values): names known only when it runs
                names.add(keyword.arg)
    return names
