"""trainpipe reference training DAG (Airflow 3).

validate_data → snapshot_dataset → detect_drift → retrain (skips the rest unless detect_drift
says to retrain: always with ``retrain_on: always``, the default) → (with ``tune``: tune_model's
workers, mapped over one study, → tune_model's summary →) train_model →
profile_training, evaluate_model → gate (skips the rest unless the decision passed) →
optimize_model (with ``optimize.enabled`` or the cpu-smb profile) → register_model. With
``require_approval``: register_model registers the challenger only → approve (a person answers;
Reject when ``approval_timeout_hours`` pass) → promote_model / record_rejection.

Settings come from the pipeline config named by ``TRAINPIPE_CONFIG`` (read once at
parse time: a small YAML file, no database or connection lookups) and can be
overridden per run through DAG params. ``TRAINPIPE_AIRFLOW_MODE=kubernetes`` runs
each step as a KubernetesPodOperator with the component image; ``local`` (the
default) runs the same entrypoint on the worker.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from trainpipe.pipelines import graph
from trainpipe.pipelines.dag_topology import RUN_DIR, DagSettings, render, switches

SETTINGS = DagSettings()
CONFIG = SETTINGS.config
step = SETTINGS.step
SNAPSHOT = f"{RUN_DIR}/snapshot_dataset"

with DAG(
    dag_id="trainpipe_training",
    description="Validate, snapshot, check drift, train, profile, evaluate and register a model.",
    schedule=CONFIG.schedule,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=SETTINGS.default_args,
    doc_md=__doc__,
    tags=["trainpipe"],
    params=SETTINGS.dag_params(),
) as dag:
    TUNE = CONFIG.tune_settings()
    ON = switches(optimizes=SETTINGS.optimizes, approval_timeout=SETTINGS.approval_timeout, tune=TUNE)
    tasks = render(
        step,
        graph.steps(ON, "airflow"),
        snapshot_dir=SNAPSHOT,
        run_dir=RUN_DIR,
        asset=SETTINGS.asset,
        approval_timeout=SETTINGS.approval_timeout,
        tune=TUNE,
        mapped=SETTINGS.mapped,
    )
