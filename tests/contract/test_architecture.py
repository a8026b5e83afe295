"""The architecture, enforced: which layer may import what, each component folder's metadata agreeing
with its compiled spec, and the Python versions the package admits.

The import rules are read from the source (AST), so they hold for every code path, not only the
ones a test happens to import:

- no core, spec, contract, training, serving or other orchestrator-free module imports kfp or
  airflow anywhere (a core never pulls an orchestrator SDK in, not even inside a function);
- no DAG file, pipeline module, face or spec imports torch, tensorflow, horovod,
  great_expectations, dvc or mlflow at module level (they load when the step runs, not when a
  scheduler parses a DAG or a laptop compiles the pipeline).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

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
#: Orchestrator-edge modules that are not faces: the CLI and the local engines drive kfp.local and dag.test().
EDGE = [
    REPO / "src/trainpipe/cli.py",
    REPO / "src/trainpipe/runner.py",
    REPO / "src/trainpipe/scaffold.py",
    REPO / "pipelines",
    REPO / "dags",
]


def _files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
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
        "src/trainpipe/serving/loader.py",
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


#: What the platform sets for a step: the entrypoint reads it once (trainpipe.contract.runtime) and a core gets it as an argument.
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
        "import os\nfrom trainpipe.contract.policy import load_policy\np = load_policy()\nh = os.environ.get('TRAINPIPE_HARDWARE_PROFILE')\n"
    )
    assert len(platform_reads(planted)) == 2


@pytest.mark.parametrize("folder", COMPONENT_DIRS, ids=lambda p: p.name)
def test_metadata_agrees_with_the_compiled_component_spec(folder):
    from trainpipe.images import image_for

    meta = yaml.safe_load((folder / "metadata.yaml").read_text())
    spec = yaml.safe_load((folder / "component.yaml").read_text())
    name = folder.name
    assert meta["name"] == name and meta["entrypoint"] == f"python -m trainpipe.components.{name}"
    executors = spec["deploymentSpec"]["executors"]
    (executor,) = executors.values()
    assert meta["image"] == executor["container"]["image"] == image_for(name), (
        meta["image"],
        executor["container"]["image"],
    )
    accelerated = image_for(name, accelerated=True)
    assert meta.get("accelerated_image", meta["image"]) == accelerated
    assert set(meta) <= {
        "name",
        "stability",
        "entrypoint",
        "image",
        "accelerated_image",
        "external_services",
        "description",
    }


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
