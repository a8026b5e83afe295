"""Baseline for DAG parse time: an Airflow DAG with no tasks."""

from datetime import datetime

from airflow.sdk import DAG

with DAG(dag_id="bench_empty", schedule=None, start_date=datetime(2026, 1, 1)):
    pass
