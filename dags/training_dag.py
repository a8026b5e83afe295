"""trainpipe reference training DAG (Airflow 3).

validate_data → snapshot_dataset → train_model → profile_training, evaluate_model
→ gate (short-circuit) → register_model.

Settings come from the pipeline config named by ``TRAINPIPE_CONFIG`` (read once at
parse time: a small YAML file, no database or connection lookups) and can be
overridden per run through DAG params. ``TRAINPIPE_AIRFLOW_MODE=kubernetes`` runs
each step as a KubernetesPodOperator with the component image; ``local`` (the
default) runs the same entrypoint on the worker.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from trainpipe.components.snapshot_dataset.airflow_task import SnapshotDatasetOperator
from trainpipe.components.validate_data.airflow_task import ValidateDataOperator
from trainpipe.faces.airflow_face import component_task, dataset_asset, model_steps
from trainpipe.pipelines.config import PipelineConfig, load_pipeline_config
from trainpipe.profiles import get_profile

_config_path = os.environ.get("TRAINPIPE_CONFIG")
CONFIG = load_pipeline_config(_config_path) if _config_path else PipelineConfig(data="data.csv").resolved()
MODE = os.environ.get("TRAINPIPE_AIRFLOW_MODE", "local")
IMAGE = os.environ.get("TRAINPIPE_IMAGE", "ghcr.io/trainpipe/trainpipe-cpu:0.1.0")

RUN_DIR = "{{ params.workspace }}/airflow-runs/{{ run_id | replace(':', '_') | replace('+', '_') }}"

PROFILE = get_profile(CONFIG.profile)


def step(operator_cls, task_id: str, settings: dict, **kwargs):
    resources = PROFILE.train if task_id == "train_model" else PROFILE.default
    return component_task(operator_cls, task_id, settings, mode=MODE, image=IMAGE, profile=PROFILE, resources=resources, **kwargs)


default_args = {
    "retries": 3,
    "retry_delay": timedelta(seconds=10),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
    "execution_timeout": timedelta(hours=1),
}


with DAG(
    dag_id="trainpipe_training",
    description="Validate, snapshot, train, profile, evaluate and register a model.",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=default_args,
    doc_md=__doc__,
    tags=["trainpipe"],
    params={
        "data": CONFIG.data,
        "label_column": CONFIG.label_column,
        "workspace": CONFIG.workspace,
        "suite": CONFIG.suite,
        "dataset_name": CONFIG.dataset_name,
        "dvc_repo_dir": CONFIG.dvc_repo_dir,
        "dvc_remote_url": CONFIG.dvc_remote_url,
        "tracking_uri": CONFIG.tracking_uri,
        "experiment_name": CONFIG.experiment_name,
        "model_name": CONFIG.model_name,
        "alias": CONFIG.alias,
        "thresholds": CONFIG.thresholds,
        "train": CONFIG.train.model_dump(),
    },
) as dag:
    validate = step(
        ValidateDataOperator,
        "validate_data",
        {"data": "{{ params.data }}", "output_dir": f"{RUN_DIR}/validate_data", "label_column": "{{ params.label_column }}", "suite": "{{ params.suite }}"},
        retries=0,  # a failed suite or a bad file does not fix itself
    )
    snapshot = step(
        SnapshotDatasetOperator,
        "snapshot_dataset",
        {
            "data": f"{RUN_DIR}/validate_data",
            "output_dir": f"{RUN_DIR}/snapshot_dataset",
            "repo_dir": "{{ params.dvc_repo_dir }}",
            "remote_url": "{{ params.dvc_remote_url }}",
            "dataset_name": "{{ params.dataset_name }}",
        },
        outlets=[dataset_asset(CONFIG.dataset_name)],  # the asset event carries the DVC hash: retrain_dag listens
    )
    train, _ = model_steps(step, snapshot_dir=f"{RUN_DIR}/snapshot_dataset", run_dir=RUN_DIR, train_keys=CONFIG.train.model_dump())
    validate >> snapshot >> train
