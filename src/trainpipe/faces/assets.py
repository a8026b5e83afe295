"""An Airflow task's asset events, the same for both faces (the operator on the worker and the pod).

Stdlib only, and importing neither face: each face imports it.
"""

from __future__ import annotations

import datetime
from typing import Any


def emit_assets(
    operator_cls: Any, settings: dict[str, Any], outlets: Any, context: Any, result: dict[str, Any]
) -> None:
    """Each outlet's event (either mode's face), its extra (the component's ``asset_extra``) saying when it
    was made and, where this run trains what it made (a train_model task downstream), which run: a DAG
    scheduled on the asset leaves that snapshot to it."""
    extra = operator_cls.asset_extra(result, settings)
    if extra is None:
        return
    extra["made_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    task = context.get("task")
    later = task.get_flat_relatives(upstream=False) if task is not None else []
    if any(t.task_id == "train_model" for t in later):
        dag = context.get("dag")
        extra["trained_by"] = f"run {context.get('run_id')} of {getattr(dag, 'dag_id', 'its DAG')}"
    for asset in outlets or []:
        context["outlet_events"][asset].extra = extra
