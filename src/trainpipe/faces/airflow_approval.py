"""Airflow's human-in-the-loop approval, as the DAGs use it (imported only with require_approval:
the standard provider's HITL module is not parsed otherwise)."""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator

# The answer is kept under its own key, whatever it was: a rejection skips the tasks after the
# approval, and with them the return value the operator would have pushed.
from trainpipe.faces.airflow_operator import ANSWER_KEY


class TrainpipeApprovalOperator(ApprovalOperator):
    """Airflow's ApprovalOperator, unchanged but for one thing: the answer (the option chosen, who
    chose it, the reason typed into its form) is pushed under :data:`ANSWER_KEY` before Airflow acts
    on it, so the task that records a rejection can say who rejected and why."""

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        user = event.get("responded_by_user") or {}
        context["ti"].xcom_push(
            key=ANSWER_KEY,
            value={
                "chosen_options": list(event.get("chosen_options") or []),
                "params_input": dict(event.get("params_input") or {}),
                "responded_by_user": {"id": str(user.get("id", "")), "name": str(user.get("name", ""))}
                if user
                else None,
                "error": event.get("error_type") if "error" in event else None,
            },
        )
        return super().execute_complete(context=context, event=event)
