"""A component stands alone in a team's pipeline: a KFP pipeline and an Airflow DAG written by a team,
validate → snapshot → train → evaluate → register, without profile_training (the optional step),
compile, run (kfp.local, dag.test()) and register a model."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

KFP_PIPELINE = """
import sys
from kfp import compiler, dsl, local
from kfp.dsl import Dataset

from trainpipe.components.evaluate_model.kfp_component import evaluate_model
from trainpipe.components.register_model.kfp_component import register_model
from trainpipe.components.snapshot_dataset.kfp_component import snapshot_dataset
from trainpipe.components.train_model.kfp_component import train_model
from trainpipe.components.validate_data.kfp_component import validate_data


@dsl.pipeline(name="team-pipeline")
def team_pipeline(data: str, repo_dir: str, remote_url: str, tracking_uri: str):
    raw = dsl.importer(artifact_uri=data, artifact_class=Dataset)
    validated = validate_data(data=raw.output)
    snap = snapshot_dataset(data=validated.outputs["validated"], repo_dir=repo_dir, remote_url=remote_url)
    trained = train_model(data=snap.outputs["snapshot"], nproc_per_node=1, epochs=2, tracking_uri=tracking_uri)
    evaluated = evaluate_model(
        model=trained.outputs["model"], data=snap.outputs["snapshot"], model_name="standalone-kfp",
        tracking_uri=tracking_uri,
    )
    with dsl.If(evaluated.outputs["Output"] == True):  # noqa: E712
        register_model(
            model=trained.outputs["model"], decision=evaluated.outputs["decision"], model_name="standalone-kfp",
            tracking_uri=tracking_uri,
        )


root, data, tracking = sys.argv[1:4]
compiler.Compiler().compile(team_pipeline, package_path=f"{root}/team.yaml")
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=f"{root}/kfp", raise_on_error=True)
team_pipeline(data=data, repo_dir=f"{root}/repo", remote_url=f"{root}/remote", tracking_uri=tracking)
print("ran")
"""

DAG_FILE = """
from datetime import datetime
from airflow.sdk import DAG
from trainpipe.components.evaluate_model.airflow_task import EvaluateModelOperator
from trainpipe.components.register_model.airflow_task import RegisterModelOperator
from trainpipe.components.snapshot_dataset.airflow_task import SnapshotDatasetOperator
from trainpipe.components.train_model.airflow_task import TrainModelOperator
from trainpipe.components.validate_data.airflow_task import ValidateDataOperator

ROOT, DATA, TRACKING = {root!r}, {data!r}, {tracking!r}
with DAG(dag_id="team_dag", start_date=datetime(2026, 1, 1), schedule=None) as dag:
    v = ValidateDataOperator(task_id="validate_data", settings={{"data": DATA, "output_dir": f"{{ROOT}}/v"}})
    s = SnapshotDatasetOperator(task_id="snapshot_dataset", settings={{
        "data": f"{{ROOT}}/v", "output_dir": f"{{ROOT}}/s", "repo_dir": f"{{ROOT}}/repo",
        "remote_url": f"{{ROOT}}/remote"}})
    t = TrainModelOperator(task_id="train_model", settings={{
        "data": f"{{ROOT}}/s", "output_dir": f"{{ROOT}}/m", "nproc_per_node": 1, "epochs": 2,
        "tracking_uri": TRACKING}})
    e = EvaluateModelOperator(task_id="evaluate_model", settings={{
        "model": f"{{ROOT}}/m", "data": f"{{ROOT}}/s", "output_dir": f"{{ROOT}}/e",
        "model_name": "standalone-airflow", "tracking_uri": TRACKING}})
    r = RegisterModelOperator(task_id="register_model", settings={{
        "model": f"{{ROOT}}/m", "decision": f"{{ROOT}}/e", "output_dir": f"{{ROOT}}/r",
        "model_name": "standalone-airflow", "tracking_uri": TRACKING}})
    v >> s >> t >> e >> r
"""

RUN_DAG = """
import sys
from airflow.utils import db
db.upgradedb()
from airflow.dag_processing.dagbag import DagBag
run = DagBag(sys.argv[1]).dags["team_dag"].test()
print("state", run.state)
"""


def test_a_kfp_pipeline_without_the_optional_steps_compiles_runs_and_registers(tmp_path, digits_csv, mlflow_server):
    import mlflow

    from trainpipe.pipelines.compile import validate_pipeline_yaml

    script = tmp_path / "team_pipeline.py"
    script.write_text(KFP_PIPELINE)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(digits_csv), mlflow_server],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ran"), (proc.stdout + proc.stderr)[-4000:]
    validate_pipeline_yaml(tmp_path / "team.yaml")
    versions = mlflow.MlflowClient(mlflow_server).search_model_versions("name = 'standalone-kfp'")
    assert [v.version for v in versions] == ["1"]
    assert "lineage.training_profile.samples_per_second" not in versions[0].tags


def test_an_airflow_dag_without_the_optional_steps_runs_and_registers(tmp_path, digits_csv, mlflow_server):
    """Slow on purpose (about a minute): a team's own DAG runs every step for real under dag.test(), from raw
    data to a registered version."""
    import mlflow

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "team_dag.py").write_text(
        textwrap.dedent(DAG_FILE.format(root=str(tmp_path / "run"), data=str(digits_csv), tracking=mlflow_server))
    )
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    proc = subprocess.run(
        [sys.executable, "-c", RUN_DAG, str(dags)], capture_output=True, text=True, env=env, timeout=900, check=False
    )
    assert proc.returncode == 0 and "state success" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]
    versions = mlflow.MlflowClient(mlflow_server).search_model_versions("name = 'standalone-airflow'")
    assert [v.version for v in versions] == ["1"]
