"""`make component NAME=...` writes a component with every role whose own test passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.contract


def test_make_component_scaffolds_a_working_component():
    name = f"scaffold_check_{uuid.uuid4().hex[:6]}"
    folder = REPO / "components" / name
    test = folder / "tests" / f"test_{name}_component.py"  # beside its code, as every component's
    try:
        proc = subprocess.run(
            ["make", "-s", "component", f"NAME={name}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        roles = {
            "__init__.py",
            "spec.py",
            "core.py",
            "__main__.py",
            "kfp_component.py",
            "airflow_task.py",
            "README.md",
            "metadata.yaml",
        }
        assert {p.name for p in folder.iterdir() if p.is_file()} == roles
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        assert "3 passed" in run.stdout
        again = subprocess.run(
            [sys.executable, "-m", "trainpipe.app.cli", "scaffold", name],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert again.returncode == 2 and "already exists" in again.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        test.unlink(missing_ok=True)


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
