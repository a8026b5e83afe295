"""trainpipe retraining DAG (Airflow 3): data-aware, no clock.

Scheduled on the dataset's Asset, which snapshot_dataset updates with the DVC content hash
in the event's extra. When the newest event says the snapshot committed new data, it trains,
profiles, evaluates against the champion and registers on that snapshot; an event for
unchanged data (same hash) is skipped at the first task.

Same settings (``TRAINPIPE_CONFIG``) and modes (``TRAINPIPE_AIRFLOW_MODE``) as training_dag.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import DAG

from trainpipe.faces.airflow_face import component_task, dataset_asset, model_steps, new_snapshot
from trainpipe.pipelines.config import PipelineConfig, load_pipeline_config
from trainpipe.profiles import get_profile

_config_path = os.environ.get("TRAINPIPE_CONFIG")
CONFIG = load_pipeline_config(_config_path) if _config_path else PipelineConfig(data="data.csv").resolved()
MODE = os.environ.get("TRAINPIPE_AIRFLOW_MODE", "local")
IMAGE = os.environ.get("TRAINPIPE_IMAGE", "ghcr.io/trainpipe/trainpipe-cpu:0.1.0")
PROFILE = get_profile(CONFIG.profile)
RUN_DIR = "{{ params.workspace }}/airflow-runs/{{ run_id | replace(':', '_') | replace('+', '_') }}"


def step(operator_cls, task_id: str, settings: dict, **kwargs):
    resources = PROFILE.train if task_id == "train_model" else PROFILE.default
    return component_task(operator_cls, task_id, settings, mode=MODE, image=IMAGE, profile=PROFILE, resources=resources, **kwargs)


with DAG(
    dag_id="trainpipe_retrain_on_new_data",
    description="Retrain when the dataset's snapshot has a new content hash.",
    schedule=[dataset_asset(CONFIG.dataset_name)],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": 3,
        "retry_delay": timedelta(seconds=10),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=10),
        "execution_timeout": timedelta(hours=1),
    },
    doc_md=__doc__,
    tags=["trainpipe"],
    params={
        "label_column": CONFIG.label_column,
        "workspace": CONFIG.workspace,
        "tracking_uri": CONFIG.tracking_uri,
        "experiment_name": CONFIG.experiment_name,
        "model_name": CONFIG.model_name,
        "alias": CONFIG.alias,
        "thresholds": CONFIG.thresholds,
        "train": CONFIG.train.model_dump(),
    },
) as dag:
    changed = ShortCircuitOperator(
        task_id="new_snapshot",
        python_callable=new_snapshot,
        retries=0,
        doc_md="Continue only when the triggering asset event carries a new content hash; returns the snapshot directory.",
    )
    train, _ = model_steps(step, snapshot_dir="{{ ti.xcom_pull(task_ids='new_snapshot') }}", run_dir=RUN_DIR, train_keys=CONFIG.train.model_dump())
    changed >> train
