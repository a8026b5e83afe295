"""The README's way to run your own DAG before deploying it, as written, on a DAG this test writes.

The README's block cannot run on the reader's data (``/data/snapshot``), so its lines run here in a scratch
folder whose ``my_dags/`` holds a ``my_training`` DAG of one TrainModelOperator on a small CSV. The block once
read ``DagBag(include_examples=False)``, a TypeError on Airflow 3.3 that nothing caught while it was only
checked statically.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

INTRO = "To run your DAG on your machine before deploying it"


def _readme_block() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after = text[text.index(INTRO) :]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    assert block, "the README's block after its intro"
    return block.group(1)


DAG = """
from datetime import datetime
from airflow.sdk import DAG
from trainpipe.components.train_model.airflow_task import TrainModelOperator

with DAG(dag_id="my_training", start_date=datetime(2026, 1, 1), schedule=None, render_template_as_native_obj=True):
    TrainModelOperator(
        task_id="train_model",
        settings={{
            "data": "{data}",
            "output_dir": "{out}/{{{{ run_id }}}}",
            "label_column": "target",
            "nproc_per_node": 1,
            "epochs": 1,
            "train_config": {{"hidden_units": [8], "learning_rate": "{{{{ params.lr }}}}"}},
            "tracking_uri": "sqlite:///{out}/mlflow.db",
        }},
        params={{"lr": 0.05}},
    )
"""


def test_the_readme_dag_test_lines_run_a_dag_as_written(tmp_path, tiny_csv):
    """``airflow db migrate`` and one training under ``airflow dags test`` (about a minute on two cores)."""
    (tmp_path / "my_dags").mkdir()
    out = tmp_path / "out"
    (tmp_path / "my_dags" / "my_dag.py").write_text(DAG.format(data=tiny_csv, out=out), encoding="utf-8")
    bindir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRAINPIPE_CONFIG"))}
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _readme_block()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    metrics = list(out.glob("*/metrics.jsonl"))
    assert metrics, f"no training under {out}: {(proc.stdout + proc.stderr)[-3000:]}"
    assert (tmp_path / "airflow" / "airflow.db").is_file()
