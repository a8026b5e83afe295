"""The folders the docs' examples run in: tiny stand-ins for the files they name, built once per session.

Three stages, each built once per test session (under pytest-xdist, by whichever worker needs it first,
under a file lock, in the folder the workers share) and only when an example needs it:

- ``files``: what the docs name as given: ``raw.csv`` (400 rows of scikit-learn's digits, pooled to 4x4
  pixels: 16 features, still a square for ``builtin:cnn``), ``raw-parquet/`` (the same rows, a numeric
  label, two files), ``my_suite.json``, ``old.csv``/``new.csv``, ``new_rows.csv``, a priced hardware profile
  ``team-a100.yaml``, a team package ``mypkg`` (``mypkg.models:MyNet``, ``mypkg.metrics:error_cost``), and
  ``components/``, the checkout's (its exported component specs);
- ``outputs``: the pipeline's outputs the components' READMEs start from (``out/validated``,
  ``out/snapshot`` and ``snapshot/``, ``out/model``, ``out/eval``, ``ws/`` with the DVC repository and remote
  and the MLflow database, ``my-model@champion`` registered), made by the READMEs' own commands
  (:data:`PREREQUISITES`);
- ``feast``: ``entities.csv`` and ``feature_repo/`` (Feast's local provider, applied), service ``training``.

Each document gets a scratch folder of its own: a copy of ``files``, and of ``outputs`` or ``feast`` once one
of its examples names what they hold (:data:`PROVIDES`). Its commands see ``MLFLOW_TRACKING_URI``
``sqlite:///ws/mlflow.db``, the database the docs name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.docs.examples import REPO, Block, environ, split_files

#: Which stage holds a path an example names (its first component).
PROVIDES = {"outputs": ("out", "snapshot", "ws"), "feast": ("entities.csv", "feature_repo")}
#: The tracking URI every command sees (the one the docs name).
TRACKING_URI = "sqlite:///ws/mlflow.db"
#: The READMEs' own commands, run once to make the ``outputs`` stage.
PREREQUISITES = (
    "python -m trainpipe.components.validate_data --data raw.csv --output-dir out/validated --label-column label",
    "python -m trainpipe.components.snapshot_dataset --data out/validated --output-dir out/snapshot "
    "--repo-dir ws/dvc-repo --remote-url ws/dvc-remote",
    "python -m trainpipe.components.train_model --data out/snapshot --output-dir out/model "
    f"--tracking-uri {TRACKING_URI}",
    "python -m trainpipe.components.evaluate_model --model out/model --data out/snapshot --output-dir out/eval "
    "--model-name my-model",
    "python -m trainpipe.components.register_model --model out/model --decision out/eval --output-dir out/reg "
    "--model-name my-model",
)

MODELS = '''"""A stand-in for a team's model module: the docs' training function builds MyNet(width, n_classes)."""

import torch
from torch import nn

FEATURES = 16  # the scratch data's feature columns


class MyNet(nn.Module):
    def __init__(self, width: int, n_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x / 16.0)
'''
METRICS = '''"""A stand-in for a team's metrics: each is f(y_true, y_pred) -> float."""

import numpy as np


def error_cost(y_true, y_pred) -> float:
    """The mean cost of a wrong prediction (one unit each here; a team's cost matrix in earnest)."""
    return float(np.mean(np.asarray(y_true) != np.asarray(y_pred)))
'''
SUITE = {
    "name": "my_suite",
    "expectations": [
        {"type": "expect_column_to_exist", "kwargs": {"column": "{label_column}"}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "{label_column}"}},
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 100}},
    ],
}
PRICED_PROFILE = """name: team-a100
train: {accelerator_type: nvidia.com/gpu, accelerator_count: 1, cpu_request: "8", memory_request: 32G}
prices: {currency: EUR, gpu_hour: 3.10, cpu_core_hour: 0.04, node_hour: 0.25}
"""


def build_files(path: Path) -> None:
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_digits

    path.mkdir(parents=True)
    digits = load_digits()
    pixels = digits.images.reshape(-1, 4, 2, 4, 2).mean(axis=(2, 4)).reshape(-1, 16)
    frame = pd.DataFrame(pixels, columns=[f"pixel_{i}" for i in range(16)]).assign(label=digits.target)
    frame = frame.sample(n=400, random_state=0).reset_index(drop=True)
    frame.to_csv(path / "raw.csv", index=False, float_format="%g")
    (path / "raw-parquet").mkdir()
    numeric = frame.assign(label=frame["label"].astype("float64"))
    for i, part in enumerate(np.array_split(numeric, 2)):
        part.to_parquet(path / "raw-parquet" / f"part-{i}.parquet", index=False)
    frame.iloc[:200].to_csv(path / "old.csv", index=False, float_format="%g")
    frame.iloc[200:].assign(pixel_3=frame["pixel_3"].iloc[200:] + 4).to_csv(
        path / "new.csv", index=False, float_format="%g"
    )
    frame.drop(columns="label").iloc[:5].to_csv(path / "new_rows.csv", index=False, float_format="%g")
    (path / "my_suite.json").write_text(json.dumps(SUITE, indent=1))
    (path / "team-a100.yaml").write_text(PRICED_PROFILE)
    (path / "components").symlink_to(REPO / "components")  # the exported specs, versioned in the checkout
    (path / "mypkg").mkdir()
    (path / "mypkg" / "__init__.py").write_text("")
    (path / "mypkg" / "models.py").write_text(MODELS)
    (path / "mypkg" / "metrics.py").write_text(METRICS)


def build_outputs(path: Path, files: Path) -> None:
    shutil.copytree(files, path, symlinks=True)
    for command in PREREQUISITES:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=path, env=command_env(), capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            raise RuntimeError(f"`{command}` exited {proc.returncode}: {proc.stderr[-3000:]}")
    (path / "snapshot").symlink_to("out/snapshot")


def build_feast(path: Path) -> None:
    import numpy as np
    import pandas as pd

    from tests.helpers.feast_repo import make_feature_repo

    path.mkdir(parents=True)
    rng = np.random.default_rng(0)
    customers = np.arange(1, 31)
    weeks = pd.date_range("2026-03-01", periods=4, freq="7D", tz="UTC")
    activity = pd.DataFrame(
        [(c, t, float(rng.gamma(2, 50)), int(rng.integers(0, 20))) for c in customers for t in weeks],
        columns=["customer_id", "event_timestamp", "spend_30d", "visits_30d"],
    )
    make_feature_repo(path / "feature_repo", {"customer_activity": activity}, key="customer_id")
    rows = 120
    entities = pd.DataFrame(
        {
            "customer_id": rng.choice(customers, rows),
            "event_timestamp": weeks[0] + pd.to_timedelta(rng.integers(1, 28 * 24, rows), unit="h"),
            "label": rng.integers(0, 2, rows),
        }
    )
    entities.to_csv(path / "entities.csv", index=False)


def command_env() -> dict[str, str]:
    """The environment of a command in the docs: this venv's bin first on PATH, the docs' tracking URI, and
    nothing of the test session's trainpipe or MLflow settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINPIPE_", "MLFLOW_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_TRACKING_URI"] = TRACKING_URI
    return env


class DocEnv:
    """The session's stages, and each document's scratch folder (:func:`scratch_for`)."""

    def __init__(self, tmp_path_factory: Any) -> None:
        base = tmp_path_factory.getbasetemp()
        # the workers of one xdist session share their base's parent: a stage is built once for all of them
        self.shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "doc-stages"
        self.shared.mkdir(exist_ok=True)
        self.factory = tmp_path_factory
        self.airflow_home = tmp_path_factory.mktemp("doc-airflow")

    def stage(self, name: str) -> Path:
        """The stage's folder, built now unless another worker built it (or failed to: its error again)."""
        from filelock import FileLock

        path = self.shared / name
        done, failed = path.with_suffix(".done"), path.with_suffix(".failed")
        with FileLock(str(path) + ".lock"):
            if failed.exists():
                raise RuntimeError(failed.read_text())
            if not done.exists():
                shutil.rmtree(path, ignore_errors=True)
                try:
                    if name == "files":
                        build_files(path)
                    elif name == "outputs":
                        build_outputs(path, self.stage("files"))
                    else:
                        build_feast(path)
                except Exception as exc:
                    failed.write_text(f"the docs' {name} stage could not be built: {exc}")
                    raise
                done.touch()
        return path

    def scratch_for(self, example: Any) -> Scratch:
        """The scratch folder of the example's document, made at its first example."""
        namespace = example.namespace
        if "_scratch" not in namespace:
            name = Path(example.document.path).resolve().relative_to(REPO).with_suffix("").as_posix().replace("/", "-")
            path = self.factory.mktemp(name)
            shutil.copytree(self.stage("files"), path, symlinks=True, dirs_exist_ok=True)
            namespace["_scratch"] = Scratch(path, self)
            namespace["_scratch"].write_files([region.parsed for _, region in example.document.regions])
        return namespace["_scratch"]


class Scratch:
    """One document's folder: its examples run here, in order, each seeing what the earlier ones left."""

    def __init__(self, path: Path, docs: DocEnv) -> None:
        self.path = path
        self.docs = docs
        self.copied: set[str] = set()

    def write_files(self, blocks: list[Block]) -> None:
        """Write the document's file blocks (a team package its commands use), in the document's order."""
        for block in blocks:
            for name, content in (split_files(block.source) if block.language == "python" else {}).items():
                (self.path / name).parent.mkdir(parents=True, exist_ok=True)
                (self.path / name).write_text(content)

    def provide(self, words: list[str]) -> None:
        """Copy in the stages that hold a path the words name (an ``--output-dir`` is the example's own)."""
        named = [w for i, w in enumerate(words) if i == 0 or words[i - 1] not in ("--output-dir", "-o")]
        for word in named:
            for value in (word, word.split("=", 1)[-1]):
                value = value.removeprefix("sqlite:///")
                wanted = {s for s, paths in PROVIDES.items() if value.split("/")[0] in paths}
                for stage in ({"outputs"} if value.startswith("models:/") else wanted) - self.copied:
                    self._copy(stage)

    def _copy(self, stage: str) -> None:
        self.copied.add(stage)
        source = self.docs.stage(stage)
        for name in PROVIDES[stage]:
            if (source / name).is_symlink():
                (self.path / name).unlink(missing_ok=True)
                (self.path / name).symlink_to(os.readlink(source / name))
            elif (source / name).is_dir():
                shutil.copytree(source / name, self.path / name, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(source / name, self.path / name)

    def env(self) -> dict[str, str]:
        return {**command_env(), "AIRFLOW_HOME": str(self.docs.airflow_home)}

    @contextlib.contextmanager
    def inside(self, env: dict[str, str] | None = None) -> Iterator[None]:
        """Run in this process as if from the scratch folder: its cwd, its team package importable, Airflow's
        home a temporary one; afterwards the modules imported from the folder are forgotten."""
        cwd = os.getcwd()
        os.chdir(self.path)
        sys.path.insert(0, str(self.path))
        values = {"AIRFLOW_HOME": str(self.docs.airflow_home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        try:
            with environ({**values, **(env or {})}):
                yield
        finally:
            os.chdir(cwd)
            sys.path.remove(str(self.path))
            for name, module in list(sys.modules.items()):
                if str(getattr(module, "__file__", None) or "").startswith(str(self.path)):
                    del sys.modules[name]
