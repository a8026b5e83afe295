"""``make component NAME=...`` / ``trainpipe scaffold NAME``: a new component on the trainpipe
contract, with every role (spec, core, entrypoint, KFP face, Airflow face, README, metadata)
and a passing test, ready to change.

The example it writes counts a dataset's rows and checks a minimum, so the contract's parts
are all in use: typed config with one-line errors, an input artifact, an atomic output, the
result JSON, and lineage.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from trainpipe.contract.errors import InputError

FILES = {
    "__init__.py": '"""{name}: a trainpipe component."""\n',
    "spec.py": '''"""{name}: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT

NAME = "{name}"
SUMMARY_FILE = "summary.json"


class {cls}Params(StrictModel):
    """Settings of {name} that are not artifacts."""

    min_rows: int = Field(1, ge=0, description="fewer rows than this is a bad input")


class {cls}Config({cls}Params):
    """Everything {name} needs, artifacts included."""

    data: str = Field(..., min_length=1, description="a CSV/Parquet file or a dataset artifact", json_schema_extra=INPUT)
    output_dir: str = Field(..., min_length=1, description="where the summary goes", json_schema_extra=OUTPUT)


class {cls}Result(BaseModel):
    """What {name} reports."""

    rows: int
    columns: list[str]
    lineage: dict[str, Any] = Field(default_factory=dict)

    def summary(self) -> str:
        return f"{{self.rows}} rows, {{len(self.columns)}} columns"
''',
    "core.py": '''"""{name}: the work. Heavy libraries are imported inside the function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainpipe.components.{name}.spec import NAME, SUMMARY_FILE, {cls}Config, {cls}Result
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json
from trainpipe.tabular import read_table


def {name}(config: {cls}Config, lineage: dict[str, Any]) -> {cls}Result:
    """Count the rows of a dataset and refuse one that is too small.

    Raises:
        InputError: unreadable data, or fewer than ``min_rows`` rows.
    """
    df = read_table(config.data, "data")
    if len(df) < config.min_rows:
        raise InputError(f"data: {{len(df)}} rows, fewer than min_rows {{config.min_rows}}")
    result = {cls}Result(rows=len(df), columns=[str(c) for c in df.columns])
    atomic_write_json(Path(config.output_dir) / SUMMARY_FILE, result.model_dump(exclude={{"lineage"}}))
    lineage = dict(lineage)
    lineage[NAME] = {{"rows": result.rows}}
    result.lineage = lineage
    return result


__all__ = ["NAME", "{name}"]
''',
    "__main__.py": '''"""Container entrypoint: ``python -m trainpipe.components.{name}``."""

from trainpipe.components.{name}.core import {name}
from trainpipe.components.{name}.spec import NAME, {cls}Config
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(NAME, {cls}Config, {name}, doc="Count a dataset's rows (a trainpipe component scaffold).")
''',
    "kfp_component.py": '''"""KFP v2 face of {name}. Holds no logic: it calls the entrypoint."""

from kfp.dsl import Artifact, Dataset, Input, Output

from trainpipe.faces.kfp_face import component


@component
def {name}(data: Input[Dataset], summary: Output[Artifact], min_rows: int = 1, run_id: str = "") -> int:
    """Count the dataset's rows; returns the count."""
    from trainpipe.faces.kfp_runtime import run_entrypoint

    result = run_entrypoint("{name}", {{"data": data.path, "output_dir": summary.path, "min_rows": min_rows}}, run_id=run_id)
    return int(result["rows"])
''',
    "airflow_task.py": '''"""Airflow 3 face of {name}. Holds no logic: it runs the entrypoint."""

from trainpipe.faces.airflow_face import TrainpipeOperator


class {cls}Operator(TrainpipeOperator):
    """Run `python -m trainpipe.components.{name}` on the worker; the result JSON is the XCom value."""

    component = "{name}"
''',
    "README.md": '''# {name}

Counts a dataset's rows and refuses one with fewer than `min_rows` (a scaffold: change it).

```sh
python -m trainpipe.components.{name} --data data.csv --output-dir out/{name}
python -m trainpipe.components.{name} --help
```

Exit codes: 0 ok, 1 internal error, 2 bad input, 75 service unavailable (retry).
Faces: `kfp_component.py` (KFP v2), `airflow_task.py` (Airflow 3).
''',
    "metadata.yaml": '''name: {name}
stability: alpha
entrypoint: python -m trainpipe.components.{name}
external_services: []
''',
}

TEST = '''"""{name}: the scaffold's own tests (entrypoint, bad input, both faces)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def _run(*args):
    return subprocess.run([sys.executable, "-m", "trainpipe.components.{name}", *args], capture_output=True, text=True, timeout=120, check=False)


def test_counts_rows_and_writes_the_output(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("a,b\\n1,2\\n3,4\\n")
    proc = _run("--data", str(data), "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 2 and result["columns"] == ["a", "b"]
    assert (tmp_path / "out" / "trainpipe.json").is_file() and (tmp_path / "out" / "summary.json").is_file()


def test_too_few_rows_is_one_line_exit_2(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("a\\n1\\n")
    proc = _run("--data", str(data), "--output-dir", str(tmp_path / "out"), "--min-rows", "5")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith("data: 1 rows, fewer than min_rows 5")
    assert not (tmp_path / "out" / "trainpipe.json").exists()


def test_faces_build():
    from trainpipe.components.{name}.airflow_task import {cls}Operator
    from trainpipe.components.{name}.kfp_component import {name}

    assert {cls}Operator.component == "{name}" and {name}.name == "{dash}"
'''


def scaffold(name: str, components_dir: str | Path, tests_dir: str | Path) -> list[Path]:
    """Write a new component folder and its test.

    Raises:
        InputError: the name is not a lowercase Python identifier, or the component exists.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise InputError(f"NAME: {name!r} must be a lowercase Python identifier (letters, digits, '_')")
    folder = Path(components_dir) / name
    if folder.exists():
        raise InputError(f"NAME: {str(folder)!r} already exists")
    cls = "".join(part.capitalize() for part in name.split("_"))
    values = {"name": name, "cls": cls, "dash": name.replace("_", "-")}
    folder.mkdir(parents=True)
    written = []
    for filename, template in FILES.items():
        path = folder / filename
        path.write_text(template.format(**values), encoding="utf-8")
        written.append(path)
    test = Path(tests_dir) / f"test_component_{name}.py"
    test.parent.mkdir(parents=True, exist_ok=True)
    test.write_text(TEST.format(**values), encoding="utf-8")
    written.append(test)
    return written
