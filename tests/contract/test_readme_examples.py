"""The README's reuse examples run as written, so they cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.contract


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)


def test_kfp_example_compiles(tmp_path):
    (block,) = [b for b in _python_blocks() if "kfp_component import" in b]
    code = block + f"\nfrom kfp import compiler\ncompiler.Compiler().compile(my_pipeline, {str(tmp_path / 'p.yaml')!r})\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "validate-data" in (tmp_path / "p.yaml").read_text()


def test_kfp_example_from_the_exported_spec_compiles(tmp_path):
    (block,) = [b for b in _python_blocks() if "load_component_from_file" in b]
    code = block + f"\nfrom kfp import compiler\ncompiler.Compiler().compile(my_spec_pipeline, {str(tmp_path / 'p.yaml')!r})\n"
    # run from the repository root (the README's relative path), in a process that imports no trainpipe
    proc = subprocess.run([sys.executable, "-c", code + "import sys; assert 'trainpipe' not in sys.modules\n"],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "validate-data" in (tmp_path / "p.yaml").read_text()


def test_airflow_example_builds_the_operator(tmp_path):
    (block,) = [b for b in _python_blocks() if "airflow" in b]
    code = block + "\nfrom airflow.sdk import DAG\nt = TrainModelOperator.__mro__\nprint('ok', [x.__name__ for x in t][:2])\n"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ok ['TrainModelOperator', 'TrainpipeOperator']" in proc.stdout
