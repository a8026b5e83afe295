"""What is generated from the components' folders and specs, and checked by ``make lint``, in one place.

- Each component's README carries its settings, inputs, outputs and result as tables generated from its spec
  (``<Name>Config`` and ``<Name>Result`` in ``spec.py``), between two markers. Declared once in the spec, so the
  table cannot say another default or another type than the entrypoint takes.
- What makes a component a component is found from its folder (``components/<name>/metadata.yaml``:
  ``trainpipe.COMPONENTS``), and the lists that name every component are generated from it: README.md's
  components table (from each ``metadata.yaml``'s ``description``), the components each image serves in
  ``images/Dockerfile`` (``trainpipe.services.images.IMAGES``), and pyproject's package list and the components'
  package data (every folder of modules under the folders ``package-dir`` maps into ``trainpipe``).

    python scripts/settings_tables.py           # rewrite them (make docs)
    python scripts/settings_tables.py --check   # exit 1 naming every file that differs (make lint)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import tomllib
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


# --- the lists that name every component, generated from the components' folders ---------------------------

COMPONENTS_BEGIN = (
    "<!-- components: generated from components/*/metadata.yaml by scripts/settings_tables.py (make docs); "
    "make lint checks it -->"
)
COMPONENTS_END = "<!-- components: end -->"
#: Folders under a package-dir root that hold modules but are no package of the wheel.
NOT_PACKAGES = {"tests", "__pycache__", "golden"}
#: The files a component's package ships besides its modules (metadata.yaml and component.yaml, the README).
COMPONENT_DATA = ["*.yaml", "*.md"]


def description(root: Path, name: str) -> str:
    """A component's one-line description, from its ``metadata.yaml`` (empty: none)."""
    import yaml

    meta = yaml.safe_load((root / "components" / name / "metadata.yaml").read_text(encoding="utf-8")) or {}
    return str(meta.get("description") or "").strip()


def components_table(root: Path, names: tuple[str, ...]) -> str:
    """README.md's components table (markers included): one row per component, in ``trainpipe.COMPONENTS``'s order."""
    lines = [
        COMPONENTS_BEGIN,
        "",
        "| component | does | KFP face | Airflow face |",
        "|---|---|---|---|",
    ]
    for name in names:
        does = f"{_cell(description(root, name))} ([README](components/{name}/README.md))"
        lines.append(f"| `{name}` | {does} | `{name}` | `{_camel(name)}Operator` |")
    return "\n".join([*lines, "", COMPONENTS_END])


def with_components_table(readme: str, section: str) -> str:
    """``readme`` with its components table replaced (the markers must be there: the README places it)."""
    if COMPONENTS_BEGIN not in readme or COMPONENTS_END not in readme:
        raise ValueError(f"README.md: no {COMPONENTS_BEGIN!r} ... {COMPONENTS_END!r} markers")
    head, _, rest = readme.partition(COMPONENTS_BEGIN)
    return head + section + rest.partition(COMPONENTS_END)[2]


def with_image_components(dockerfile: str, images: dict[str, tuple[str, ...]]) -> str:
    """``images/Dockerfile`` with each ``runtime-<kind>`` stage's ``TRAINPIPE_COMPONENTS`` set to what that image
    serves (``trainpipe.services.images.IMAGES``), the list its build checks by running each one's ``--help``."""
    for kind, served in images.items():
        stage = re.search(rf"^FROM \S+ AS runtime-{re.escape(kind)}\n(?:(?!FROM ).*\n)*", dockerfile, re.M)
        if stage is None or "TRAINPIPE_COMPONENTS=" not in stage.group(0):
            raise ValueError(f"images/Dockerfile: no runtime-{kind} stage setting TRAINPIPE_COMPONENTS")
        body = re.sub(r'TRAINPIPE_COMPONENTS="[\w ]*"', f'TRAINPIPE_COMPONENTS="{" ".join(served)}"', stage.group(0))
        dockerfile = dockerfile[: stage.start()] + body + dockerfile[stage.end() :]
    return dockerfile


def packages(root: Path, package_dir: dict[str, str]) -> list[str]:
    """Every package the wheel holds: each folder with an ``__init__.py`` under the folders ``package-dir`` maps
    into ``trainpipe`` (tests and the golden files left out), each root first, then its packages sorted."""
    found = []
    for package, folder in package_dir.items():
        base = root / folder
        inside = []
        for path, dirs, files in os.walk(base):  # links are not followed: a folder ships once, where it lies
            dirs[:] = [d for d in dirs if d not in NOT_PACKAGES and not d.startswith(".")]
            if "__init__.py" in files and Path(path) != base:
                inside.append(".".join([package, *Path(path).relative_to(base).parts]))
        found += [package, *sorted(inside)]
    return found


def with_packages(pyproject: str, root: Path, names: tuple[str, ...]) -> str:
    """``pyproject.toml`` with ``[tool.setuptools]``'s ``packages`` generated (:func:`packages`) and each
    component's package data (:data:`COMPONENT_DATA`) listed, every other line as it is."""
    setuptools = tomllib.loads(pyproject)["tool"]["setuptools"]
    listed = "".join(f'    "{p}",\n' for p in packages(root, setuptools["package-dir"]))
    block = re.compile(r"^packages = \[\n(?:[ \t]+.*\n)*?\]\n", re.M)
    pyproject, count = block.subn(f"packages = [\n{listed}]\n", pyproject, count=1)
    if not count:
        raise ValueError("pyproject.toml: no multi-line `packages = [` list in [tool.setuptools]")
    header = "[tool.setuptools.package-data]\n"
    start = pyproject.index(header) + len(header)
    end = pyproject.find("\n\n", start) + 1 or len(pyproject)
    own = re.compile(r'^"trainpipe\.components\.\w+" = ')
    lines = pyproject[start:end].splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if own.match(line)), len(lines))
    data = json.dumps(COMPONENT_DATA)
    generated = [f'"trainpipe.components.{name}" = {data}\n' for name in names]
    kept = [line for line in lines if not own.match(line)]
    at = at - sum(1 for line in lines[:at] if own.match(line))
    return pyproject[:start] + "".join(kept[:at] + generated + kept[at:]) + pyproject[end:]


def _component_lists(root: Path, names: tuple[str, ...]) -> dict[Path, typing.Callable[[str], str]]:
    """Each file that names every component, and how its generated parts are rewritten."""
    from trainpipe.services.images import IMAGES

    images = {kind: image.components for kind, image in IMAGES.items()}
    return {
        root / "README.md": lambda text: with_components_table(text, components_table(root, names)),
        root / "images" / "Dockerfile": lambda text: with_image_components(text, images),
        root / "pyproject.toml": lambda text: with_packages(text, root, names),
    }


def main(argv: list[str] | None = None) -> int:
    from trainpipe import COMPONENTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated part differs from its source")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    missing = [field for name in COMPONENTS for field in undescribed(name)]
    if missing:
        print(f"settings_tables: error: {', '.join(missing)}: no description in the spec", file=sys.stderr)
        return 1
    nameless = [f"components/{name}/metadata.yaml" for name in COMPONENTS if not description(args.root, name)]
    if nameless:
        print(f"settings_tables: error: {', '.join(nameless)}: no description", file=sys.stderr)
        return 1
    rewrites: dict[Path, typing.Callable[[str], str]] = {
        args.root / "components" / name / "README.md": lambda text, name=name: with_tables(text, tables(name))
        for name in COMPONENTS
    }
    rewrites.update(_component_lists(args.root, COMPONENTS))
    stale = []
    for path, rewrite in rewrites.items():
        text = path.read_text(encoding="utf-8")
        try:
            updated = rewrite(text)
        except ValueError as exc:
            print(f"settings_tables: error: {exc}", file=sys.stderr)
            return 1
        if updated == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(args.root)))
        else:
            path.write_text(updated, encoding="utf-8")
            print(f"settings_tables: wrote {path.relative_to(args.root)}")
    if stale:
        print(
            f"settings_tables: error: {', '.join(stale)}: differs from what the specs and the components' folders "
            "give (run `make docs`)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
