"""``make component NAME=...`` / ``trainpipe scaffold NAME``: a new component on the trainpipe
contract, with every role (spec, core, dry run, entrypoint, KFP face, Airflow face, README, metadata)
and its own tests (the contract every component checks, :class:`tests.helpers.component_contract.ComponentContract`,
and its core's), ready to change. Its folder is all there is to add: ``trainpipe.COMPONENTS``, the package list,
the README's table and the images' lists are found from it (``make component`` then runs ``make docs``'s
generator and writes its compiled ``component.yaml``).

The example it writes counts a dataset's rows and checks a minimum, so the contract's parts
are all in use: typed config with one-line errors, an input artifact, an atomic output, the
result JSON, and lineage.
"""

from __future__ import annotations

import json
import keyword
import re
from pathlib import Path

from trainpipe.contract.errors import InputError

#: The namespace the components' folder maps to (pyproject's package-dir).
PACKAGE = "trainpipe.components"

FILES = {
    "__init__.py": '"""{name}: a trainpipe component."""\n',
    "spec.py": '''"""{name}: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from pydantic import Field

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT
from trainpipe.contract.result import ComponentResult

NAME = "{name}"
SUMMARY_FILE = "summary.json"


class {cls}Params(StrictModel):
    """Settings of {name} that are not artifacts."""

    min_rows: int = Field(1, ge=1, description="fewer rows than this is a bad input (an empty table always is)")


class {cls}Config({cls}Params):
    """Everything {name} needs, artifacts included."""

    data: str = Field(
        ..., min_length=1, description="a CSV/Parquet file or a dataset artifact", json_schema_extra=INPUT
    )
    output_dir: str = Field(..., min_length=1, description="where the summary goes", json_schema_extra=OUTPUT)


class {cls}Result(ComponentResult):
    """What {name} reports (and the lineage it carries on)."""

    rows: int = Field(description="the dataset's rows")
    columns: list[str] = Field(description="the dataset's columns, in their order")

    def summary(self) -> str:
        return f"{{self.rows}} rows, {{len(self.columns)}} columns"
''',
    "core.py": '''"""{name}: the work. Heavy libraries are imported inside the function."""

from __future__ import annotations

from pathlib import Path

from {package}.{name}.spec import NAME, SUMMARY_FILE, {cls}Config, {cls}Result
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime
from trainpipe.data.tabular import read_table


def {name}(config: {cls}Config, lineage: Lineage, runtime: Runtime | None = None) -> {cls}Result:
    """Count the rows of a dataset and refuse one that is too small.

    Args:
        config: Settings and paths.
        lineage: The record of the inputs; this step adds a section of its own.
        runtime: The platform's settings (policy, hardware profile); this step needs none.

    Raises:
        InputError: unreadable data, or fewer than ``min_rows`` rows.
    """
    df = read_table(config.data, "data")
    if len(df) < config.min_rows:
        raise InputError(f"data: {{len(df)}} rows, fewer than min_rows {{config.min_rows}}")
    result = {cls}Result(rows=len(df), columns=[str(c) for c in df.columns])
    atomic_write_json(Path(config.output_dir) / SUMMARY_FILE, result.model_dump(exclude={{"lineage"}}))
    result.lineage = lineage.with_(**{{NAME: {{"rows": result.rows}}}})
    return result


__all__ = ["NAME", "{name}"]
''',
    "dry.py": '''"""{name}'s dry run (:mod:`trainpipe.contract.dry`): its settings are checked, nothing is read."""

from __future__ import annotations

from typing import Any

from {package}.{name}.spec import {cls}Config, {cls}Result
from trainpipe.contract import dry
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime


def dry_run(config: {cls}Config, lineage: Lineage, runtime: Runtime) -> tuple[dict[str, Any], {cls}Result]:
    """What {name} would count: nothing; what it received is recorded, its figures are empty."""
    return {{}}, dry.stub({cls}Result, lineage=lineage)
''',
    "__main__.py": '''"""Container entrypoint: ``python -m {package}.{name}``."""

from {package}.{name}.core import {name}
from {package}.{name}.dry import dry_run
from {package}.{name}.spec import NAME, {cls}Config
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(NAME, {cls}Config, {name}, dry=dry_run, doc="Count a dataset's rows (a trainpipe component scaffold).")
''',
    "kfp_component.py": '''"""KFP v2 face of {name}: its parameters are the spec's settings (generated);
declared here are its artifacts and what the result puts on them."""

from typing import Any

from {package}.{name}.spec import NAME, {cls}Params
from trainpipe.faces.kfp_face import Face, In, Out


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> int:
    artifacts["summary"].metadata["rows"] = result["rows"]
    return int(result["rows"])


FACE = Face(
    NAME,
    {cls}Params,
    [In("data"), Out("summary", "Artifact", field="output_dir")],
    "Count the dataset's rows; returns the count.",
    publish,
    returns="int",
)
{name} = FACE.component()
''',
    "airflow_task.py": '''"""Airflow 3 face of {name}. Holds no logic: it runs the entrypoint."""

from {package}.{name}.spec import {cls}Config
from trainpipe.faces.airflow_operator import TrainpipeOperator


class {cls}Operator(TrainpipeOperator):
    """Run `python -m {package}.{name}` on the worker; the result JSON is the XCom value."""

    component = "{name}"
    config = {cls}Config
''',
    "README.md": """# {name}

Counts a dataset's rows and refuses one with fewer than `min_rows` (a scaffold: change it).

```sh
python -m trainpipe.components.{name} --data raw.csv --output-dir {name}-summary
python -m trainpipe.components.{name} --help
```

Exit codes: 0 ok, 1 internal error, 2 bad input, 75 service unavailable (retry).
Faces: `kfp_component.py` (KFP v2), `airflow_task.py` (Airflow 3).
""",
    "metadata.yaml": """name: {name}
stability: alpha
entrypoint: python -m trainpipe.components.{name}
image: {image}
external_services: []
description: "counts a dataset's rows and refuses one with fewer than `min_rows` (a scaffold: change it)"
""",
}

TEST = '''"""{name}'s own tests: its contract (entrypoint, faces, folder) and its core on a tiny CSV."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.component_contract import ComponentContract


class Test{cls}Contract(ComponentContract):
    name = "{name}"


def _run(*args):
    command = [sys.executable, "-m", "trainpipe.components.{name}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.unit
def test_counts_rows_and_writes_the_output(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("a,b\\n1,2\\n3,4\\n")
    proc = _run("--data", str(data), "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 2 and result["columns"] == ["a", "b"]
    assert (tmp_path / "out" / "trainpipe.json").is_file() and (tmp_path / "out" / "summary.json").is_file()


@pytest.mark.unit
def test_too_few_rows_is_one_line_exit_2(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("a\\n1\\n")
    proc = _run("--data", str(data), "--output-dir", str(tmp_path / "out"), "--min-rows", "5")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith("data: 1 rows, fewer than min_rows 5")
    assert not (tmp_path / "out" / "trainpipe.json").exists()


@pytest.mark.unit
def test_faces_build():
    from {package}.{name}.airflow_task import {cls}Operator
    from {package}.{name}.kfp_component import {name}

    assert {cls}Operator.component == "{name}" and {name}.name == "{dash}"
'''


def _write(folder: Path, files: dict[str, str], test: Path, test_template: str, values: dict[str, str]) -> list[Path]:
    """The folder's files and the test, from their templates; the paths written."""
    folder.mkdir(parents=True)
    written = []
    for filename, template in files.items():
        path = folder / filename
        path.write_text(template.format(**values), encoding="utf-8")
        written.append(path)
    test.parent.mkdir(parents=True, exist_ok=True)
    test.write_text(test_template.format(**values), encoding="utf-8")
    return [*written, test]


def scaffold(name: str, components_dir: str | Path, tests_dir: str | Path | None = None) -> list[Path]:
    """Write a new component folder and its test (in the folder's own ``tests/`` unless ``tests_dir`` says where).

    Raises:
        InputError: the name is not a lowercase Python identifier, or the component exists.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise InputError(f"NAME: {name!r} must be a lowercase Python identifier (letters, digits, '_')")
    folder = Path(components_dir) / name
    if folder.exists():
        raise InputError(f"NAME: {str(folder)!r} already exists")
    cls = "".join(part.title() for part in name.split("_"))  # as the docs generator and the contract test spell it
    from trainpipe.services.images import image_kind, reference

    image = reference(image_kind(name))  # the default image, whatever TRAINPIPE_IMAGE says here
    values = {"name": name, "cls": cls, "dash": name.replace("_", "-"), "image": image, "package": PACKAGE}
    tests = Path(tests_dir) if tests_dir is not None else folder / "tests"
    return _write(folder, FILES, tests / f"test_{name}_component.py", TEST, values)


# --- a training function ---------------------------------------------------------------------

TRAINING_FILES = {
    "__init__.py": '"""{name}: a team\'s training function for trainpipe\'s train_model."""\n',
    "models.py": '''"""The model. It takes raw feature rows and scales them itself, so the served model does too.

This package travels with every model it trains (MLflow code paths): keep it importable on its own.
"""

import torch
from torch import nn


class Net(nn.Module):
    """Standardize, two hidden layers, a head: one logit per class (or one value for regression)."""

    def __init__(self, features: int, outputs: int, width: int = 64) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("std", torch.ones(features))
        self.body = nn.Sequential(
            nn.Linear(features, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, outputs)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x.float() - self.mean) / self.std)
''',
    "train.py": '''"""The training function: ``train_function: {name}.train:train`` (with ``train_config``)."""

from typing import Any


def train(ctx: Any, config: dict) -> None:
    """Train on the snapshot train_model was given; trainpipe does the distribution, checkpoints,
    exact resume, telemetry and the model artifact around this loop."""
    import torch
    import torch.nn.functional as F

    from {name}.models import Net

    data = ctx.data.table()  # training rows: raw float32 features, class indices (or values)
    init = {{"features": data.n_features, "outputs": data.n_outputs, "width": int(config.get("width", 64))}}
    net = Net(**init)
    with torch.no_grad():
        net.mean.copy_(torch.tensor(data.mean))
        net.std.copy_(torch.tensor(data.std))
    model = ctx.prepare(net)
    opt = torch.optim.AdamW(model.parameters(), lr=float(config.get("lr", 1e-3)))
    ctx.restore(model=model, optimizer=opt)
    for x, y in ctx.batches(data):
        with ctx.autocast():
            out = model(x)
        if ctx.settings.task == "classification":
            loss = F.cross_entropy(out.float(), y)
        else:
            loss = F.mse_loss(out.float().squeeze(-1), y)
        ctx.backward(loss)
        ctx.step(opt)
        ctx.log(loss=loss)
    ctx.save_model(model, init_args=init)
''',
}

TRAINING_TEST = '''"""{name}: the training function's own test, through train_model as a pipeline runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PACKAGE_DIR = {package_dir}


def _train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4))
    data = tmp_path / "d.csv"
    frame = pd.DataFrame(x, columns=["a", "b", "c", "d"])
    frame.assign(label=(x[:, 0] + x[:, 1] > 0).astype(int)).to_csv(data, index=False)
    env = {{**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGE_DIR, os.environ.get("PYTHONPATH", "")])}}
    tracking = f"sqlite:///{{tmp_path / 'mlflow.db'}}"
    flags = ["--data", str(data), "--output-dir", str(tmp_path / "m"), "--tracking-uri", tracking]
    flags += ["--train-function", "{name}.train:train", "--nproc-per-node", "1", "--epochs", "3", "--batch-size", "32"]
    command = [sys.executable, "-m", "trainpipe.components.train_model", *flags, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)


def test_trains_and_writes_a_model_that_loads(tmp_path):
    proc = _train(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["train_function"] == "{name}.train:train" and result["metrics"]["loss"] < 0.7
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert meta["builder"] == "{name}.models:Net" and meta["code"] == ["{name}"]


def test_a_bad_setting_is_one_line(tmp_path):
    proc = _train(tmp_path, "--batch-size", "0")
    assert proc.returncode == 2 and "batch_size" in proc.stderr.strip().splitlines()[-1]
'''


def scaffold_training(name: str, directory: str | Path, tests_dir: str | Path) -> list[Path]:
    """Write a team package with a training function (``<directory>/<name>/``) and its test.

    Raises:
        InputError: the name is not a lowercase Python identifier, or the package exists.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name) or name == "trainpipe":
        raise InputError(f"NAME: {name!r} must be a lowercase Python identifier (letters, digits, '_'), not trainpipe")
    folder = Path(directory) / name
    if folder.exists():
        raise InputError(f"NAME: {str(folder)!r} already exists")
    values = {"name": name, "package_dir": json.dumps(str(Path(directory).resolve()))}
    return _write(folder, TRAINING_FILES, Path(tests_dir) / f"test_training_{name}.py", TRAINING_TEST, values)
