"""Baseline for DAG parse time in kubernetes mode: an Airflow DAG with one KubernetesPodOperator
task (what importing the cncf.kubernetes provider costs any DAG that runs pods)."""

from datetime import datetime

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import DAG

with DAG(dag_id="bench_kpo", schedule=None, start_date=datetime(2026, 1, 1)):
    KubernetesPodOperator(task_id="pod", name="pod", image="busybox", cmds=["true"])
