"""trainpipe retraining DAG (Airflow 3): data-aware, no clock.

Scheduled on the dataset's Asset, which snapshot_dataset updates with the DVC content hash
in the event's extra. When the newest event says the snapshot committed new data, it trains,
profiles, evaluates against the champion and registers on that snapshot; an event for
unchanged data (same hash) is skipped at the first task.

Same settings (``TRAINPIPE_CONFIG``) and modes (``TRAINPIPE_AIRFLOW_MODE``) as training_dag.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from trainpipe.faces.airflow_dag import DEFAULT_ARGS, GATE_KEYS, RUN_DIR, DagSettings, GateOperator, dataset_asset, model_steps, new_snapshot

SETTINGS = DagSettings()
CONFIG = SETTINGS.config

with DAG(
    dag_id="trainpipe_retrain_on_new_data",
    description="Retrain when the dataset's snapshot has a new content hash.",
    schedule=[dataset_asset(CONFIG.dataset_name)],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    doc_md=__doc__,
    tags=["trainpipe"],
    params=SETTINGS.params("label_column", "workspace", "tracking_uri", "experiment_name", "model_name", "alias", *GATE_KEYS, "train"),
) as dag:
    changed = GateOperator(
        task_id="new_snapshot",
        condition=new_snapshot,
        retries=0,
        doc_md="Continue only when the triggering asset event carries a new content hash; returns the snapshot directory.",
    )
    train, _ = model_steps(SETTINGS.step, snapshot_dir="{{ ti.xcom_pull(task_ids='new_snapshot') }}", run_dir=RUN_DIR, train_keys=CONFIG.train.model_dump())
    changed >> train
