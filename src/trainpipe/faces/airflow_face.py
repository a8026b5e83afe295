"""The Airflow 3 side of every component: one operator that runs the entrypoint.

Local mode runs ``python -m trainpipe.components.<name>`` on the worker; Kubernetes
mode runs the same command in a ``KubernetesPodOperator`` with the component image.
One setting (``mode``) switches them. Only transient exit codes are retried: a
failed suite, bad input or a failed gate fails the task for good.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, ClassVar, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from trainpipe.contract.errors import is_retryable_exit


def _flags(settings: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in settings.items():
        if value is None or value == "":
            continue
        args += ["--" + key.replace("_", "-"), value if isinstance(value, str) else json.dumps(value)]
    return args


class TrainpipeOperator(BaseOperator):
    """Run one trainpipe component on the worker; its result JSON is the XCom value.

    Args:
        settings: The component's settings (templated), as its CLI flags take them.
    """

    component: ClassVar[str] = ""
    template_fields: Sequence[str] = ("settings",)
    ui_color = "#e8f4ea"

    def __init__(self, *, settings: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings

    def execute(self, context: Any) -> Any:
        cmd = [sys.executable, "-m", f"trainpipe.components.{self.component}", "--orchestrator", "airflow", "--run-id", str(context["run_id"])]
        cmd += _flags(self.settings)
        env = dict(os.environ, TRAINPIPE_ORCHESTRATOR="airflow")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, check=False)
        for line in proc.stderr.splitlines():
            self.log.info("%s", line)
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        if is_retryable_exit(proc.returncode):
            raise AirflowException(f"{self.component} exited {proc.returncode} (transient, will retry): {last}")
        raise AirflowFailException(f"{self.component} exited {proc.returncode} (permanent, not retried): {last}")


def kubernetes_task(component: str, *, task_id: str, settings: dict[str, Any], image: str, namespace: str = "default", **kwargs: Any) -> Any:
    """The same command in a pod: ``KubernetesPodOperator`` with the component image.

    The result JSON goes to ``/airflow/xcom/return.json`` so it becomes the XCom value.
    """
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    return KubernetesPodOperator(
        task_id=task_id,
        name=task_id.replace("_", "-"),
        namespace=namespace,
        image=image,
        cmds=["python", "-m", f"trainpipe.components.{component}"],
        arguments=["--orchestrator", "airflow", "--run-id", "{{ run_id }}", "--result", "/airflow/xcom/return.json", *_flags(settings)],
        do_xcom_push=True,
        get_logs=True,
        **kwargs,
    )


def gate_passed(ti: Any = None, **_: Any) -> bool:
    """ShortCircuit callable: True when evaluate_model's decision passed."""
    result = ti.xcom_pull(task_ids="evaluate_model")
    return bool(result and result.get("decision", {}).get("passed"))
