"""`make component NAME=...` writes a component with every role, and the suite is green on it: run in a copy of
this working tree (never in the checkout itself), then the tiers that concern components, on the copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.contract

#: The folders pyproject's package-dir maps into ``trainpipe`` besides src/trainpipe.
MAPPED = ("components", "pipelines", "dags")
#: What a component's folder holds, each role once (its tests aside).
ROLES = {
    "__init__.py",
    "spec.py",
    "core.py",
    "dry.py",
    "__main__.py",
    "kfp_component.py",
    "airflow_task.py",
    "README.md",
    "metadata.yaml",
    "component.yaml",
}


def _checkout(where: Path) -> tuple[Path, dict[str, str]]:
    """A copy of this working tree (what git tracks or would track, as it is now), and the environment that
    imports ``trainpipe`` from it: its src/ first on the path, the mapped folders linked into the package as an
    install lays them (the links are not walked: a package is found once, where it lies)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = REPO / rel
        if source.is_file() and not source.is_symlink():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / rel)
    for folder in MAPPED:
        (where / "src" / "trainpipe" / folder).symlink_to(where / folder, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRAINPIPE_IMAGE", None)
    return where, env


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_make_component_leaves_the_component_tiers_green(tmp_path):
    """About a minute on two cores: the copy, the scaffold with `make docs`' generator and the KFP export, then one
    pytest run of the ~30 tests that concern components (the pipeline's compile among them), each a real run."""
    name = f"scaffold_check_{uuid.uuid4().hex[:6]}"
    root, env = _checkout(tmp_path / "checkout")
    venv = Path(sys.prefix)
    # the venv running this test, never rebuilt from the copy's pyproject (-o: its stamp counts as made)
    make = ["make", "-s", "-o", str(venv / ".installed-dev"), f"VENV={venv}", "component", f"NAME={name}"]
    proc = _run(make, root, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    folder = root / "components" / name
    assert {p.name for p in folder.iterdir() if p.is_file()} == ROLES
    assert (folder / "tests" / f"test_{name}_component.py").is_file()  # beside its code, as every component's

    # found, not listed: the package, its data, the README's table and the cpu image's list name it
    check = _run([sys.executable, "-c", "import trainpipe; print(' '.join(trainpipe.COMPONENTS))"], root, env)
    assert name in check.stdout.split(), check.stderr[-2000:]
    pyproject = (root / "pyproject.toml").read_text()
    assert f'"trainpipe.components.{name}",' in pyproject and f'"trainpipe.components.{name}" = [' in pyproject
    assert f"| `{name}` |" in (root / "README.md").read_text()
    assert name in (root / "images" / "Dockerfile").read_text()
    assert yaml.safe_load((folder / "metadata.yaml").read_text())["description"]
    lint = _run([sys.executable, "scripts/settings_tables.py", "--check"], root, env)
    assert lint.returncode == 0, lint.stderr[-2000:]

    # the tiers that concern components, on the copy: its own tests (its contract among them), the docs' example
    # of its README, every component's dry run, the README's table, the images' map, what the wheel ships, the
    # exported specs, and the pipeline it is not a step of
    tests = [
        f"components/{name}",
        "tests/unit/test_dry_run.py::test_every_component_has_a_dry_run_its_entrypoint_uses",
        "tests/contract/test_readme_examples.py::test_the_components_table_lists_trainpipe_components_in_their_order",
        "tests/contract/test_images.py::test_one_map_names_each_components_image",
        "tests/contract/test_images.py::test_each_image_is_lean_non_root_and_serves_its_components",
        "tests/contract/test_compile_and_imports.py::test_every_component_ships_in_the_distribution",
        "tests/contract/test_compile_and_imports.py::"
        "test_every_package_folder_ships_in_the_distribution_and_the_contracts",
        "tests/contract/test_golden.py::test_component_specs_are_up_to_date_and_load_without_trainpipe",
        "tests/contract/test_surface.py::test_every_pipeline_setting_reaches_every_step_that_takes_it",
    ]
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "0"]
    run = _run([*pytest_run, *tests], root, env, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]

    again = _run([sys.executable, "-m", "trainpipe.app.cli", "scaffold", name], root, env, timeout=120)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_what_the_scaffolds_write_passes_ruff_as_written(tmp_path):
    """`make lint` runs ruff's lint and format check over the checkout: a scaffolded component and a scaffolded
    training package pass both before anyone edits them (a face written on two lines failed the format check)."""
    from trainpipe.app.scaffold import scaffold, scaffold_training

    scaffold("count_rows", tmp_path / "components", tmp_path / "tests")
    scaffold_training("my_team", tmp_path / "team", tmp_path / "team_tests")
    ruff = [str(Path(sys.executable).parent / "ruff")]
    for check in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            [*ruff, *check, "--config", str(REPO / "pyproject.toml"), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_a_bad_name_is_refused_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "scaffold", "Bad-Name"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "trainpipe: error: NAME: 'Bad-Name' must be a lowercase Python identifier (letters, digits, '_')"
    )


def test_make_training_function_scaffolds_a_team_package_whose_test_passes(tmp_path):
    name = f"team_{uuid.uuid4().hex[:6]}"
    proc = subprocess.run(
        ["make", "-s", "training-function", f"NAME={name}", f"DIR={tmp_path}", f"TESTS={tmp_path / 'tests'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.name for p in (tmp_path / name).iterdir()} == {"__init__.py", "models.py", "train.py"}
    test = tmp_path / "tests" / f"test_training_{name}.py"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(REPO),
            "-c",
            str(REPO / "pyproject.toml"),
            str(test),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "2 passed" in run.stdout
