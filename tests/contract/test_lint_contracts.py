"""``make lint``'s layer rules would catch each violation the architecture review found: each is planted in a
copy of the package as pip installs it (the tree import-linter checks), and the tools must fail on it,
naming the rule. Nothing is exempt: the application layer (``trainpipe.app``) sits on top by contract.

- import-linter (pyproject's ``[tool.importlinter]``): a library module importing a composition (as the CLI
  and the runner did from inside functions), a component importing another (a relative import included),
  a pipeline importing a component's module other than its spec and faces, anything importing the app,
  and inside the library a layer importing one above it or a module of its own row;
- ruff: a relative import beyond a package's siblings (TID252), an import by name (TID251), which
  import-linter cannot see; and at run time the one import by name refuses the layers above the library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.contract

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package as pip installs it (no dependencies): one tree, trainpipe/{components,pipelines,dags,...},
    built from a copy of the sources (setuptools' build/ in the checkout could hold a module removed since)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in ("src", "components", "pipelines", "dags"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    site = tmp_path_factory.mktemp("lint-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", site, "."],
        cwd=source,
        check=True,
        capture_output=True,
    )
    assert (site / "trainpipe" / "components" / "train_model" / "core.py").is_file()
    return site


def lint_imports(site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache", str(REPO / "pyproject.toml")],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def planted(installed: Path, tmp_path: Path, files: dict[str, str]) -> Path:
    site = tmp_path / "site"
    shutil.copytree(installed, site, ignore=shutil.ignore_patterns("__pycache__", "*.dist-info", "bin"))
    for rel, text in files.items():
        path = site / "trainpipe" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return site


def test_the_package_as_installed_keeps_every_contract(installed):
    proc = lint_imports(installed)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 6 kept, 0 broken." in proc.stdout


VIOLATIONS = {
    "the library imports a pipeline inside a function (the CLI's old exemption)": (
        {"services/runs.py": "def load(path):\n    from trainpipe.pipelines.config import load_pipeline_config\n"},
        "application > DAGs > pipelines > components > library BROKEN",
        "trainpipe.services.runs -> trainpipe.pipelines.config",
    ),
    "the library imports the application": (
        {"contract/planted.py": "from trainpipe.app import cli\n"},
        "application > DAGs > pipelines > components > library BROKEN",
        "trainpipe.contract.planted -> trainpipe.app.cli",
    ),
    "the contract reaches up to a service inside a function (Progress's old home)": (
        {"contract/planted.py": "def f():\n    from trainpipe.services.telemetry import TrainingMetrics\n"},
        "application > DAGs > pipelines > components > library BROKEN",
        "trainpipe.contract.planted -> trainpipe.services.telemetry",
    ),
    "a service imports training": (
        {"services/serving/planted.py": "from trainpipe.training import loop\n"},
        "application > DAGs > pipelines > components > library BROKEN",
        "trainpipe.services.serving.planted -> trainpipe.training.loop",
    ),
    "a service imports another of its row": (
        {"services/serving/planted.py": "from trainpipe.services.tracking import probe\n"},
        "the MLOps services, each row using the rows below it BROKEN",
        "trainpipe.services.serving.planted -> trainpipe.services.tracking",
    ),
    "a component imports another's core with a relative import": (
        {"components/evaluate_model/planted.py": "from ..train_model.core import train_model\n"},
        "a component imports no other component",
        "trainpipe.components.evaluate_model.planted -> trainpipe.components.train_model.core",
    ),
    "a pipeline imports a component's module other than its spec and faces": (
        {"pipelines/planted.py": "from trainpipe.components.train_model.k8s import trainjob_manifest\n"},
        "DAGs and pipelines import a component only through its spec and its faces BROKEN",
        "trainpipe.pipelines.planted -> trainpipe.components.train_model.k8s",
    ),
    "a DAG imports a component's core": (
        {"dags/planted.py": "from trainpipe.components.train_model.core import train_model\n"},
        "DAGs and pipelines import a component only through its spec and its faces BROKEN",
        "trainpipe.dags.planted -> trainpipe.components.train_model.core",
    ),
    "a new top-level module that no layer names": (
        {"newthing/__init__.py": ""},
        "application > DAGs > pipelines > components > library BROKEN",
        "trainpipe.newthing",
    ),
}


@pytest.mark.parametrize("case", list(VIOLATIONS), ids=list(VIOLATIONS))
def test_import_linter_fails_on_each_planted_violation(installed, tmp_path, case):
    files, contract, where = VIOLATIONS[case]
    proc = lint_imports(planted(installed, tmp_path, files))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())  # rich wraps long lines
    assert contract in out and where in out, proc.stdout


def test_ruff_fails_on_a_relative_import_beyond_siblings_and_on_an_import_by_name(tmp_path):
    """ruff with the repository's configuration, on planted files in a copy of the source layout."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    component = tmp_path / "components" / "evaluate_model"
    component.mkdir(parents=True)
    (component / "planted.py").write_text(
        '"""Planted."""\n\nimport importlib\n\nfrom ..train_model.core import train_model\nfrom .spec import NAME\n\n'
        'core = importlib.import_module("trainpipe.components.train_model.core")\n'
        "__all__ = ['NAME', 'core', 'train_model']\n"
    )
    proc = subprocess.run(
        [str(BIN / "ruff"), "check", "--no-cache", "--output-format", "concise", "--select", "TID", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout
    found = sorted(line.split(": ", 1)[1].split(" ", 1)[0] for line in proc.stdout.splitlines() if ".py:" in line)
    assert found == ["TID251", "TID252"], proc.stdout  # the sibling import `.spec` stays allowed
    assert "planted.py:5:" in proc.stdout and "planted.py:8:" in proc.stdout


@pytest.mark.parametrize(
    "name", ["trainpipe.components.train_model.core", "trainpipe.pipelines.compile", "trainpipe.dags", "trainpipe.app"]
)
def test_the_one_import_by_name_refuses_the_layers_above_the_library(name):
    from trainpipe.contract.imports import import_module

    with pytest.raises(ImportError, match="nothing loads by name"):
        import_module(name)
    assert import_module("trainpipe.training.builtin").__name__ == "trainpipe.training.builtin"
