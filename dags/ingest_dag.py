"""trainpipe ingestion DAG (Airflow 3): new data in, a snapshot out, and the asset event that retrains.

validate_data → snapshot_dataset, and nothing after: the snapshot's asset event carries the DVC content
hash and no ``trained_by`` (no run of this DAG trains it), so ``trainpipe_retrain_on_new_data``, scheduled
on that asset, decides whether to retrain on it. The training DAG's own snapshots say the run that made
them trains them, and the retrain DAG leaves those alone: a deployment that wants data-aware retraining
deploys this DAG beside the other two and triggers it when new data lands (``airflow dags trigger
trainpipe_ingest_new_data``, the REST API, or a ``schedule`` of its own in the DAG file it copies).

Same settings (``TRAINPIPE_CONFIG``) and modes (``TRAINPIPE_AIRFLOW_MODE``) as training_dag.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from trainpipe.pipelines import graph
from trainpipe.pipelines.dag_topology import RUN_DIR, DagSettings, render

SETTINGS = DagSettings()
step = SETTINGS.step

with DAG(
    dag_id="trainpipe_ingest_new_data",
    description="Validate new data and snapshot it with DVC; the snapshot's asset event starts the retrain DAG.",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=SETTINGS.default_args,
    doc_md=__doc__,
    tags=["trainpipe"],
    params=SETTINGS.dag_params(),
) as dag:
    tasks = render(
        step,
        graph.steps((), "airflow", stop="snapshot_dataset"),
        snapshot_dir=f"{RUN_DIR}/snapshot_dataset",
        run_dir=RUN_DIR,
        asset=SETTINGS.asset,
    )
