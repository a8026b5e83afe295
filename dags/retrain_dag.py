"""trainpipe retraining DAG (Airflow 3): data-aware, no clock.

Scheduled on the dataset's Asset, which snapshot_dataset updates with the DVC content hash
in the event's extra. Of a run's batch of events, the first task weighs every one: the newest snapshot
that committed new data and that no run trains itself is the one detect_drift compares with the data
that trained the champion (found through the champion's lineage and fetched from its DVC remote); each
other event is named in the task log with why it was not (unchanged data, the training DAG's own, an
older version of the dataset). Only when the data drifted, the champion is older than
``max_champion_age_days`` or there is none, it trains, profiles, evaluates against the champion
and registers on that snapshot. A batch with no new data stops at the first task; a snapshot without
drift at ``retrain``, which logs why in one line (the audit log holds detect_drift's decision).

Same settings (``TRAINPIPE_CONFIG``) and modes (``TRAINPIPE_AIRFLOW_MODE``) as training_dag.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from trainpipe.pipelines import graph
from trainpipe.pipelines.dag_topology import RUN_DIR, DagSettings, GateOperator, new_snapshot, render, switches

# it starts from a snapshot: the settings of validate_data and snapshot_dataset are not its params, and
# it always decides on drift (detect_drift's own retrain_on)
SETTINGS = DagSettings(exclude=("data", "suite", "dataset_name", "dvc_repo_dir", "dvc_remote_url", "retrain_on"))
CONFIG = SETTINGS.config

with DAG(
    dag_id="trainpipe_retrain_on_new_data",
    description="Retrain when a new snapshot of the dataset drifted from the champion's training data.",
    schedule=[SETTINGS.asset],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=SETTINGS.default_args,
    doc_md=__doc__,
    tags=["trainpipe"],
    params=SETTINGS.dag_params(),
) as dag:
    changed = GateOperator(
        task_id="new_snapshot",
        condition=new_snapshot,
        retries=0,
        doc_md="Weighs every triggering asset event: continues with the newest snapshot of new data (returns its "
        "directory), and names each event it skipped with why.",
    )
    snapshot_dir = "{{ ti.xcom_pull(task_ids='new_snapshot') }}"
    ON = switches(optimizes=SETTINGS.optimizes, approval_timeout=SETTINGS.approval_timeout)
    tasks = render(
        SETTINGS.step,
        graph.steps(ON, "airflow", start="detect_drift"),
        snapshot_dir=snapshot_dir,
        run_dir=RUN_DIR,
        approval_timeout=SETTINGS.approval_timeout,
        roots={"detect_drift": changed},
    )
