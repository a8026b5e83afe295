"""The architecture rules that import-linter and ruff cannot state, and the folders' metadata.

The layers (application > DAGs > pipelines > components > library; components independent; DAGs and
pipelines composing components only through their specs and faces) are import-linter contracts in
pyproject.toml, checked by ``make lint``; relative imports beyond a package's siblings and imports by
name are ruff's (TID252, TID251). ``tests/contract/test_lint_contracts.py`` plants each violation and
expects ``make lint``'s tools to fail. What stays here, read from the source (AST):

- no import cycle among trainpipe's modules, not even through an import inside a function (the tool's
  acyclic contract works on packages; a cycle is fixed by moving code, not by hiding an import);
- no import by name (``__import__``, ``importlib.import_module``, ``pkgutil.resolve_name``) but the one
  guarded place, ``trainpipe.contract.imports`` (import-linter cannot see one, and ruff not the bare builtin);
- no core, spec, contract, training, serving or other orchestrator-free module imports kfp or
  airflow anywhere (a core never pulls an orchestrator SDK in, not even inside a function);
- no DAG file, pipeline module, face or spec imports torch, tensorflow, horovod,
  great_expectations, dvc or mlflow at module level (they load when the step runs, not when a
  scheduler parses a DAG or a laptop compiles the pipeline): the tool does not tell a module-level
  import from one inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.contract

ORCHESTRATORS = ("kfp", "airflow")
HEAVY = ("torch", "tensorflow", "horovod", "great_expectations", "dvc", "mlflow")
COMPONENT_DIRS = sorted(p for p in (REPO / "components").iterdir() if (p / "spec.py").is_file())

#: Modules that are the orchestrator edge: they may import kfp or airflow (but nothing heavy at module level).
FACES = (
    [REPO / "src/trainpipe/faces"]
    + [d / "kfp_component.py" for d in COMPONENT_DIRS]
    + [d / "airflow_task.py" for d in COMPONENT_DIRS]
)
#: Orchestrator-edge modules that are not faces: the application (the CLI and the local engines drive kfp.local
#: and dag.test()), the pipelines and the DAGs.
EDGE = [REPO / "src/trainpipe/app", REPO / "pipelines", REPO / "dags"]


def _files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        out += sorted(f for f in p.rglob("*.py") if "tests" not in f.relative_to(p).parts) if p.is_dir() else [p]
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def orchestrator_free_modules() -> list[Path]:
    """Every module of the package that is neither a face nor the orchestrator edge."""
    edge = {f.resolve() for f in _files(FACES + EDGE)}
    candidates = _files([REPO / "src/trainpipe", REPO / "components"])
    return [f for f in candidates if f.resolve() not in edge and "__pycache__" not in f.parts]


def imported_roots(tree: ast.AST, module_level_only: bool) -> list[tuple[str, int]]:
    """``(top-level package, line)`` of each import; with ``module_level_only``, those that run
    when the module is imported (not inside a function, and not under ``if TYPE_CHECKING``)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and module_level_only:
                continue
            if isinstance(child, ast.If) and module_level_only and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(ast.Module(body=child.orelse, type_ignores=[]), in_function)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name.split(".")[0], child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module.split(".")[0], child.lineno))
            elif isinstance(child, ast.Call) and isinstance(child.func, (ast.Attribute, ast.Name)):
                name = child.func.attr if isinstance(child.func, ast.Attribute) else child.func.id
                if (
                    name in ("import_module", "__import__")
                    and child.args
                    and isinstance(child.args[0], ast.Constant)
                    and isinstance(child.args[0].value, str)
                ):
                    found.append((child.args[0].value.split(".")[0], child.lineno))
            visit(child, in_function)

    visit(tree, False)
    return found


def violations(path: Path, forbidden: tuple[str, ...], module_level_only: bool) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{_rel(path)}:{line} imports {root}"
        for root, line in imported_roots(tree, module_level_only)
        if root in forbidden
    ]


def test_no_core_spec_or_contract_module_imports_an_orchestrator():
    modules = orchestrator_free_modules()
    names = {_rel(m) for m in modules}
    # the guard covers what it claims to: every core and spec, the contract, training and serving
    assert {f"components/{d.name}/core.py" for d in COMPONENT_DIRS} <= names
    assert {f"components/{d.name}/spec.py" for d in COMPONENT_DIRS} <= names
    assert {
        "src/trainpipe/contract/entrypoint.py",
        "src/trainpipe/training/loop.py",
        "src/trainpipe/services/serving/loader.py",
    } <= names
    bad = [v for m in modules for v in violations(m, ORCHESTRATORS, module_level_only=False)]
    assert bad == [], "orchestrator SDK imported outside the faces:\n" + "\n".join(bad)


def test_no_dag_pipeline_face_or_spec_imports_a_heavy_library_at_module_level():
    parse_time = _files(FACES + EDGE + [d / "spec.py" for d in COMPONENT_DIRS] + [REPO / "src/trainpipe/__init__.py"])
    assert any(p.name == "training_dag.py" for p in parse_time) and any(
        p.name == "training_pipeline.py" for p in parse_time
    )
    bad = [v for m in parse_time for v in violations(m, HEAVY, module_level_only=True)]
    assert bad == [], "heavy library imported at module level where DAGs and pipelines are parsed:\n" + "\n".join(bad)


#: Where the layers are, as import roots (the folders map into one namespace: pyproject's package-dir).
LAYERS = {
    "src/trainpipe": "trainpipe",
    "components": "trainpipe.components",
    "pipelines": "trainpipe.pipelines",
    "dags": "trainpipe.dags",
}


def module_name(path: Path, root: Path = REPO) -> str:
    rel = path.relative_to(root)
    for folder, package in LAYERS.items():
        if rel.is_relative_to(folder):
            parts = list(rel.relative_to(folder).with_suffix("").parts)
            return ".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])
    raise ValueError(path)


def trainpipe_modules() -> dict[str, Path]:
    out = {}
    for folder in LAYERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if not {"__pycache__", "golden", "tests"} & set(path.relative_to(REPO / folder).parts):
                out[module_name(path)] = path
    return out


def internal_imports(path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """Every trainpipe module ``path`` imports (at any depth, TYPE_CHECKING left out), by the module
    the name resolves to: ``from trainpipe.x import y`` is ``trainpipe.x.y`` when that is a module."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(ast.Module(body=child.orelse, type_ignores=[]))
                continue
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [f"{child.module}.{a.name}" for a in child.names]
            for name in names:
                if name.split(".")[0] == "trainpipe" and (target := resolve(name)) is not None:
                    found.append((target, child.lineno))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def import_cycles(modules: dict[str, Path]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), over every import."""
    graph = {m: {t for t, _ in internal_imports(p, modules) if t != m} for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in graph:
        if v not in index:
            connect(v)
    return cycles


def test_no_import_cycle_even_inside_functions():
    cycles = import_cycles(trainpipe_modules())
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_rule_would_catch_a_cycle_hidden_inside_functions(tmp_path):
    """Planted: two library modules importing each other inside functions."""
    planted = {
        "src/trainpipe/planted_a.py": "def f():\n    from trainpipe.planted_b import g\n",
        "src/trainpipe/planted_b.py": "def g():\n    from trainpipe import planted_a\n",
    }
    modules = trainpipe_modules()
    for rel, text in planted.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        modules[module_name(path, tmp_path)] = path
    assert ["trainpipe.planted_a", "trainpipe.planted_b"] in import_cycles(modules)


def test_the_guards_would_catch_a_violation(tmp_path):
    source = tmp_path / "core.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import json\n"
        "if TYPE_CHECKING:\n    import torch\n"
        "import mlflow.pyfunc\n"
        "def f():\n    import tensorflow\n    from kfp import dsl\n"
        "try:\n    import dvc.repo\nexcept ImportError:\n    pass\n"
        "import importlib\nimportlib.import_module('airflow.sdk')\n"
    )
    lines = [line.split(" imports ")[1] for line in violations(source, HEAVY, module_level_only=True)]
    assert lines == ["mlflow", "dvc"]  # not the TYPE_CHECKING import, not the one inside a function
    anywhere = [line.split(" imports ")[1] for line in violations(source, ORCHESTRATORS, module_level_only=False)]
    assert anywhere == ["kfp", "airflow"]


#: The one module that imports by name: it refuses the layers above the library (contract/imports.py).
BY_NAME = REPO / "src/trainpipe/contract/imports.py"
#: The model loader every registered model carries travels without trainpipe (stdlib only), so it imports a
#: trusted builder by name itself.
TRAVELS_ALONE = REPO / "src/trainpipe/services/serving/loader.py"
#: The old names of the modules that moved into folders resolve to the moved modules, by name: only the library
#: modules its fixed table names (contract/imports.py would close a cycle through ``trainpipe`` itself).
OLD_NAMES = REPO / "src/trainpipe/contract/moved.py"
#: What imports by name, out of import-linter's sight: importlib's, the builtin's and pkgutil's.
BY_NAME_SOURCES = {
    "importlib": ("import_module", "__import__"),
    "builtins": ("__import__",),
    "pkgutil": ("resolve_name",),
}


def imports_by_name(path: Path) -> list[str]:
    """Where a module imports by name itself: ``__import__`` (called, passed or looked up with getattr),
    ``importlib.import_module``, ``pkgutil.resolve_name``, or one of them imported from its module.
    ``trainpipe.contract.imports.import_module`` is the way (ruff's TID251 says the same of the dotted names;
    it cannot see the bare builtin)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name) and node.id == "__import__":
            found.append((line, f"{_rel(path)}:{line} uses __import__"))
        elif isinstance(node, ast.Constant) and node.value in ("__import__", "resolve_name"):
            found.append((line, f"{_rel(path)}:{line} looks up {node.value}"))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.attr in BY_NAME_SOURCES.get(node.value.id, ()):
                found.append((line, f"{_rel(path)}:{line} uses {node.value.id}.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module in BY_NAME_SOURCES:
            for alias in node.names:
                if alias.name in BY_NAME_SOURCES[node.module]:
                    found.append((line, f"{_rel(path)}:{line} imports {node.module}.{alias.name}"))
    return [what for _, what in sorted(found)]


def test_nothing_imports_by_name_but_the_one_guarded_place():
    alone = {BY_NAME.resolve(), TRAVELS_ALONE.resolve(), OLD_NAMES.resolve()}
    modules = [p for p in trainpipe_modules().values() if p.resolve() not in alone]
    assert BY_NAME.is_file() and len(modules) > 100
    assert imports_by_name(BY_NAME), "the guarded place is where importlib.import_module is called"
    bad = [v for m in modules for v in imports_by_name(m)]
    assert bad == [], (
        "an import by name outside trainpipe.contract.imports (import-linter cannot see it):\n" + "\n".join(bad)
    )


def test_the_import_by_name_rule_would_catch_each_way(tmp_path):
    source = tmp_path / "planted.py"
    source.write_text(
        "import builtins, importlib, pkgutil\n"
        "from pkgutil import resolve_name\n"
        "a = __import__('trainpipe.app')\n"
        "b = getattr(builtins, '__import__')('trainpipe.app')\n"
        "c = pkgutil.resolve_name('trainpipe.app:main')\n"
        "d = importlib.import_module('trainpipe.app')\n"
        "from trainpipe.contract.imports import import_module\n"
        "e = import_module('teampkg.train')\n"
    )
    found = [v.split(":", 1)[1] for v in imports_by_name(source)]
    assert found == [
        "2 imports pkgutil.resolve_name",
        "3 uses __import__",
        "4 looks up __import__",
        "5 uses pkgutil.resolve_name",
        "6 uses importlib.import_module",
    ]


# : What the platform sets for a step: the entrypoint reads it once (trainpipe.contract.runtime) and a core gets it as
# an argument.
PLATFORM_SETTINGS = ("TRAINPIPE_POLICY", "TRAINPIPE_HARDWARE_PROFILE", "TRAINPIPE_TRUSTED_MODEL_CODE")


def platform_reads(path: Path) -> list[str]:
    """Where a module reads the platform's settings itself: ``load_policy()`` or their variables by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "load_policy":
            found.append(f"{_rel(path)}:{node.lineno} calls load_policy()")
        elif isinstance(node, ast.Constant) and node.value in PLATFORM_SETTINGS:
            found.append(f"{_rel(path)}:{node.lineno} reads {node.value}")
    return found


def test_cores_are_given_the_policy_and_profile_instead_of_reading_the_environment(tmp_path):
    cores = [d / "core.py" for d in COMPONENT_DIRS] + [REPO / "components/train_model/k8s.py"]
    bad = [v for c in cores for v in platform_reads(c)]
    assert bad == [], "a core reads the platform's settings itself:\n" + "\n".join(bad)
    planted = tmp_path / "core.py"
    planted.write_text(
        "import os\nfrom trainpipe.contract.policy import load_policy\np = load_policy()\nh = "
        "os.environ.get('TRAINPIPE_HARDWARE_PROFILE')\n"
    )
    assert len(platform_reads(planted)) == 2


def test_python_versions_are_bounded_only_where_a_dependency_is():
    import tomllib
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    admitted = SpecifierSet(project["requires-python"])
    assert all(admitted.contains(v) for v in ("3.10", "3.11", "3.12", "3.13", "3.14")), project["requires-python"]
    # TensorFlow 2.21 has no wheels for 3.14: the extra says so with a marker, the package does not
    (tf,) = [Requirement(r) for r in project["optional-dependencies"]["tensorflow"]]
    assert (
        tf.marker is not None
        and not tf.marker.evaluate({"python_version": "3.14"})
        and tf.marker.evaluate({"python_version": "3.13"})
    )


#: A class past this many lines of code (docstrings, comments and blank lines aside) usually holds two jobs.
MAX_CLASS_CODE_LINES = 250


def class_code_lines(path: Path) -> dict[str, int]:
    """Lines of code of each class in ``path``: its span without docstrings, comments and blank lines."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            if isinstance(body[0].value.value, str):
                docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            span = range(node.lineno, node.end_lineno + 1)
            code = [
                n for n in span if n not in docs and lines[n - 1].strip() and not lines[n - 1].strip().startswith("#")
            ]
            out[f"{_rel(path)}:{node.name}"] = len(code)
    return out


def test_no_class_holds_two_jobs():
    sizes = {k: v for p in trainpipe_modules().values() for k, v in class_code_lines(p).items()}
    assert "src/trainpipe/training/context.py:BaseContext" in sizes
    big = {k: v for k, v in sizes.items() if v > MAX_CLASS_CODE_LINES}
    assert big == {}, f"classes over {MAX_CLASS_CODE_LINES} lines of code: {big}"


def test_train_models_core_keeps_only_the_components_flow():
    """train_model's core is the step's flow; its jobs live in the library beside their kin (the MLflow run's
    thread with the tracking run, the platform's stop with the loop's control, the budget with costs)."""
    core = REPO / "components/train_model/core.py"
    assert len(core.read_text(encoding="utf-8").splitlines()) < 300
    source = core.read_text(encoding="utf-8")
    for job in ("class ", "threading.Thread", "signal.signal(", "Meter("):
        assert job not in source, f"components/train_model/core.py holds a library's job again: {job!r}"


def test_the_library_declares_ranges_and_the_images_hold_the_exact_versions():
    """Installed beside a team's stack (its Airflow image, its MLflow server, its CUDA torch), trainpipe
    must not force a version: every requirement is a range from the lowest tested version to below
    the next major; the exact versions live in the images' locks and the dev constraints."""
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for deps in [project["dependencies"], *project["optional-dependencies"].values()]:
        for text in deps:
            req = Requirement(text)
            if req.name == "trainpipe":
                continue
            ops = {s.operator for s in req.specifier}
            assert "==" not in ops and ">=" in ops and ("<" in ops or "<=" in ops), f"{text}: not a range"
    constraints = (REPO / "images" / "constraints.txt").read_text()
    assert "\nmlflow==" in constraints and "\nkfp==" in constraints and "\napache-airflow==" in constraints


#: What a core calls to rebuild a team's model from its code, trusting what its runtime trusts: an artifact's
#: loader, a registered version's (a champion's ``model()``), or the runtime's trusted packages themselves.
REBUILDS = ("load_artifact", "version_model", "trusts", "trusted_code")


def _rebuilds_a_model(core: Path) -> bool:
    for node in ast.walk(ast.parse(core.read_text(encoding="utf-8"))):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in REBUILDS:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "model":
            if not node.args:  # registry.Champion.model()
                return True
    return False


def _declares(spec: Path, setting: str) -> bool:
    tree = ast.parse(spec.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == setting for n in ast.walk(tree))


def test_a_step_takes_trusted_packages_exactly_when_its_core_rebuilds_a_model():
    """``trusted_packages`` says which team code a step may import to rebuild a model: a step that rebuilds
    none must not offer it (a setting that does nothing), and one that does must (or a team cannot make it
    trust its code)."""
    wrong = [
        f"{d.name}: {'declares trusted_packages but rebuilds no model' if declares else 'rebuilds a model'}"
        for d in COMPONENT_DIRS
        if (declares := _declares(d / "spec.py", "trusted_packages")) != _rebuilds_a_model(d / "core.py")
        and d.name != "train_model"  # it runs the team's function: trusting it is implicit
    ]
    assert not wrong, wrong
