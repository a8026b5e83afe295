"""The images' locked requirements, as images/Dockerfile installs them (hashes required).

The data image's lock installs into a fresh virtualenv here exactly as the Dockerfile installs it (no
dependency resolution, trainpipe without build isolation), `pip check` is clean, every component it serves
answers ``--help``, and its two components run for real without any ML framework installed.

The cpu image's lock (about 4 GB: torch, TensorFlow, MLflow, ...) is resolved by pip in hash-checking mode
without installing it: every pin has a wheel for the image's platform whose hash matches, and every
requirement of every locked distribution is itself locked (pip refuses an unpinned one in that mode), which is
what `pip check` would say of the installed set. The dev virtualenv CI tests in holds the same versions
(tests/contract/test_images.py), so the components are run there. The wheel the images install carries the
DAG files `trainpipe run --engine airflow-local` reads.

The GPU image's lock pins the CUDA build of torch (several GB of nvidia-* wheels, no GPU here): it is
checked against the CPU lock in tests/contract/test_images.py, not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def _sh(*cmd: str, cwd: Path | None = None, timeout: int = 1200) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd[:4])}…: {(proc.stdout + proc.stderr)[-3000:]}"
    return proc.stdout


def _image_env(kind: str, tmp_path: Path) -> Path:
    """/opt/trainpipe of the image, built here the way images/Dockerfile builds it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("src", "components", "pipelines", "dags"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    venv = tmp_path / "venv"
    _sh(sys.executable, "-m", "venv", str(venv))
    py = venv / "bin" / "python"
    _sh(
        str(py),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--require-hashes",
        "--no-deps",
        "-r",
        str(REPO / "images" / kind / "requirements.lock"),
    )
    _sh(str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", str(src))
    _sh(str(py), "-m", "pip", "check")
    return venv


def _size_mb(venv: Path) -> int:
    return int(_sh("du", "-sm", str(venv)).split()[0])


def test_the_cpu_lock_resolves_completely_with_its_hashes(tmp_path):
    """Every pin of the cpu image's lock has a wheel whose hash matches, and nothing it needs is left unpinned:
    pip resolves the whole lock in hash-checking mode (reading pip's cache), without installing 4 GB."""
    report = tmp_path / "report.json"
    _sh(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--require-hashes",
        "--report",
        str(report),
        "-r",
        str(REPO / "images" / "cpu" / "requirements.lock"),
    )
    names = {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}
    assert {"torch", "tensorflow", "mlflow", "great-expectations", "dvc", "kfp", "optuna"} <= names


def test_the_wheel_the_images_install_ships_the_dag_files(tmp_path):
    """`trainpipe run --engine airflow-local` reads the DAG files the installed package ships, not a checkout's."""
    import zipfile

    _sh(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(tmp_path),
        str(REPO),
    )
    (wheel,) = tmp_path.glob("trainpipe-*.whl")
    files = set(zipfile.ZipFile(wheel).namelist())
    assert {"trainpipe/dags/training_dag.py", "trainpipe/dags/retrain_dag.py"} <= files
    assert {f"trainpipe/components/{c}/__main__.py" for c in ("train_model", "validate_data")} <= files


def test_the_data_lock_installs_and_runs_its_components_without_torch(tmp_path, tiny_csv):
    """Slow on purpose (about a minute): it installs the data image's whole locked environment into a fresh
    virtualenv exactly as the Dockerfile does, the check that the lock installs with hashes and `pip check` clean
    and that its components run without torch; pip's cache keeps the downloads."""
    from trainpipe.services.images import IMAGES

    kind = "data"
    venv = _image_env(kind, tmp_path)
    py = str(venv / "bin" / "python")
    for component in IMAGES[kind].components:
        out = _sh(py, "-m", f"trainpipe.components.{component}", "--help", cwd=tmp_path)
        assert f"python -m trainpipe.components.{component}" in out and "Exit codes" in out
    installed = json.loads(_sh(py, "-m", "pip", "list", "--format", "json"))
    names = {p["name"].lower().replace("_", "-") for p in installed}
    print(f"\n{kind}: {_size_mb(venv)} MB installed, {len(names)} distributions")
    assert not names & {"torch", "tensorflow", "mlflow", "horovod"}
    work = tmp_path / "work"
    v = json.loads(
        _sh(
            py,
            "-m",
            "trainpipe.components.validate_data",
            "--data",
            str(tiny_csv),
            "--label-column",
            "target",
            "--output-dir",
            str(work / "validated"),
            cwd=tmp_path,
        )
        .strip()
        .splitlines()[-1]
    )
    assert v["success"] is True and v["rows"] == 240
    s = json.loads(
        _sh(
            py,
            "-m",
            "trainpipe.components.snapshot_dataset",
            "--data",
            str(work / "validated"),
            "--output-dir",
            str(work / "snapshot"),
            "--repo-dir",
            str(work / "repo"),
            "--remote-url",
            str(work / "remote"),
            "--dataset-name",
            "tiny",
            cwd=tmp_path,
        )
        .strip()
        .splitlines()[-1]
    )
    assert s["md5"] == v["data_md5"] and s["pushed"] >= 1
