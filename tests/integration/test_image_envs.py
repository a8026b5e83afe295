"""Each image's locked requirements install into a fresh virtualenv here exactly as images/Dockerfile
installs them (hashes required, no dependency resolution, trainpipe without build isolation), `pip
check` is clean, and every component that image serves answers ``--help``; the data image's
environment also runs its two components for real, without any ML framework installed.

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

WHEELHOUSE = Path(os.environ.get("WHEELHOUSE", Path.home() / ".cache" / "trainpipe" / "wheels"))


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
    if kind == "cpu":  # images/Dockerfile builds Horovod from its sdist (C++17 fix); here `make horovod` did
        wheels = sorted(WHEELHOUSE.glob("horovod-0.28.1-*.whl"))
        assert wheels, f"no Horovod wheel in {WHEELHOUSE}: run make horovod"
        _sh(str(py), "-m", "pip", "install", "--quiet", "--no-deps", str(wheels[-1]))
    _sh(str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", str(src))
    _sh(str(py), "-m", "pip", "check")
    return venv


def _size_mb(venv: Path) -> int:
    return int(_sh("du", "-sm", str(venv)).split()[0])


@pytest.mark.parametrize("kind", ["data", "cpu"])
def test_locked_environment_installs_and_serves_its_components(kind, tmp_path, tiny_csv):
    """Slow on purpose (the data image about a minute, the cpu image 2-3 minutes): it installs the image's whole
    locked environment (the cpu image's torch, TensorFlow, MLflow, ...: about 4 GB) into a fresh virtualenv exactly
    as the Dockerfile does, the only check here that the lock installs with hashes and `pip check` clean; pip's
    cache keeps the downloads."""
    from trainpipe.images import IMAGES

    venv = _image_env(kind, tmp_path)
    py = str(venv / "bin" / "python")
    for component in IMAGES[kind].components:
        out = _sh(py, "-m", f"trainpipe.components.{component}", "--help", cwd=tmp_path)
        assert f"python -m trainpipe.components.{component}" in out and "Exit codes" in out
    installed = json.loads(_sh(py, "-m", "pip", "list", "--format", "json"))
    names = {p["name"].lower().replace("_", "-") for p in installed}
    print(f"\n{kind}: {_size_mb(venv)} MB installed, {len(names)} distributions")
    if kind == "data":
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
    else:
        assert {"torch", "tensorflow", "horovod", "mlflow", "great-expectations", "dvc", "kfp"} <= names
        # `trainpipe run --engine airflow-local` reads the DAG files the installed package ships, not a checkout's
        folder = Path(
            _sh(py, "-c", "from trainpipe.app.runner import dags_folder; print(dags_folder())", cwd=tmp_path).strip()
        )
        assert folder.is_relative_to(venv) and {"training_dag.py", "retrain_dag.py"} <= {
            p.name for p in folder.iterdir()
        }
