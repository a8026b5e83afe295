"""Each component's README carries its settings, inputs, outputs and result as tables generated from its
spec (``<Name>Config`` and ``<Name>Result`` in ``spec.py``), between two markers. Declared once in the spec,
so the table cannot say another default or another type than the entrypoint takes.

    python scripts/settings_tables.py           # rewrite the tables (make docs)
    python scripts/settings_tables.py --check   # exit 1 naming every README whose table differs (make lint)
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
BEGIN = "<!-- settings: generated from spec.py by scripts/settings_tables.py (make docs); make lint checks it -->"
END = "<!-- settings: end -->"
HEADING = "## Settings, inputs and outputs"


def _camel(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


def type_name(annotation: Any) -> str:
    """A type as a reader writes it: ``int``, ``"a" | "b"``, ``list[int]``, ``str or null``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        named = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]" if inner else origin.__name__
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    try:
        return "`" + json.dumps(value, ensure_ascii=False) + "`"
    except TypeError:
        return f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _role(field: Any) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    role = extra.get("role")
    if role == "input":
        return "input (raw data or an artifact)" if extra.get("source") else "input artifact"
    return "output artifact" if role == "output" else "setting"


def models(name: str) -> tuple[type[BaseModel], type[BaseModel]]:
    """A component's ``<Name>Config`` and ``<Name>Result``."""
    spec = importlib.import_module(f"trainpipe.components.{name}.spec")
    return getattr(spec, f"{_camel(name)}Config"), getattr(spec, f"{_camel(name)}Result")


def undescribed(name: str) -> list[str]:
    """The settings and result fields of a component whose spec does not say what they are."""
    config, result = models(name)
    return [
        f"{model.__name__}.{f}"
        for model in (config, result)
        for f, info in model.model_fields.items()
        if not info.description
    ]


def tables(name: str) -> str:
    """The generated section of one component's README (markers included)."""
    config, result = models(name)
    lines = [
        BEGIN,
        "",
        f"Every setting is a flag of `python -m trainpipe.components.{name}` (`--{{name-with-dashes}}`), a key of its",
        "`--config` file, a parameter of its KFP component and a key of its Airflow operator's `settings`.",
        "",
        "| name | kind | type | default | what it is |",
        "|---|---|---|---|---|",
    ]
    for fname, field in config.model_fields.items():
        row = [f"`{fname}`", _role(field), _cell(type_name(field.annotation)), _default(field)]
        lines.append("| " + " | ".join([*row, _cell(field.description or "")]) + " |")
    lines += [
        "",
        f"The result (`--result`, stdout's last line, the KFP outputs, the Airflow XCom) holds `{result.__name__}`:",
        "",
        "| field | type | what it is |",
        "|---|---|---|",
    ]
    for fname, field in result.model_fields.items():
        row = [f"`{fname}`", _cell(type_name(field.annotation)), _cell(field.description or "")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join([*lines, "", END])


def with_tables(readme: str, section: str) -> str:
    """``readme`` with its generated section replaced (or, where it has none, appended under its heading)."""
    if BEGIN in readme and END in readme:
        head, _, rest = readme.partition(BEGIN)
        _, _, tail = rest.partition(END)
        return head + section + tail
    return readme.rstrip("\n") + f"\n\n{HEADING}\n\n{section}\n"


def main(argv: list[str] | None = None) -> int:
    from trainpipe import COMPONENTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a README's table differs from its spec")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    missing = [field for name in COMPONENTS for field in undescribed(name)]
    if missing:
        print(f"settings_tables: error: {', '.join(missing)}: no description in the spec", file=sys.stderr)
        return 1
    stale = []
    for name in COMPONENTS:
        readme = args.root / "components" / name / "README.md"
        text = readme.read_text(encoding="utf-8")
        updated = with_tables(text, tables(name))
        if updated == text:
            continue
        if args.check:
            stale.append(str(readme.relative_to(args.root)))
        else:
            readme.write_text(updated, encoding="utf-8")
            print(f"settings_tables: wrote {readme.relative_to(args.root)}")
    if stale:
        print(
            f"settings_tables: error: {', '.join(stale)}: the settings table differs from spec.py (run `make docs`)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
