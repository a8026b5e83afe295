"""Airflow 3 face of train_model. Holds no logic: it runs the entrypoint, or, for a Slurm job, submits
it and defers the wait to the triggerer."""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk.exceptions import AirflowException

from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.faces.airflow_operator import TrainpipeOperator


class TrainModelOperator(TrainpipeOperator):
    """Run `python -m trainpipe.components.train_model` on the worker; the result JSON is the XCom value.

    With a ``slurm`` setting the job is submitted with sbatch from the worker (a login node of the
    cluster); with ``deferrable`` (the default) the wait runs in Airflow's triggerer, so no worker
    slot is held while the job queues and trains, and the task resumes to collect the model. A killed
    task cancels the job (``scancel``).

    Args:
        deferrable: Wait for a Slurm job in the triggerer (False: in the task, holding its slot).
    """

    component = "train_model"
    config = TrainModelConfig

    def __init__(self, *, deferrable: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self._slurm_job: str | None = None

    def _on_slurm(self) -> bool:
        value = self.settings.get("slurm")
        return value not in (None, "", "null", "None")

    def execute(self, context: Any) -> Any:
        if not (self.deferrable and self._on_slurm()):
            return super().execute(context)
        from trainpipe.components.train_model.slurm_job import submit_settings
        from trainpipe.contract.errors import TrainpipeError
        from trainpipe.faces.airflow_operator import outcome
        from trainpipe.faces.airflow_slurm import SlurmJobTrigger

        try:
            job_id, job = submit_settings(self.settings, str(context["run_id"]), {**os.environ, **self.env})
        except TrainpipeError as exc:
            raise outcome(self.component, exc.exit_code, str(exc)) from None
        self._slurm_job = job_id
        self.defer(
            trigger=SlurmJobTrigger(job_id, job.poll_s, job.timeout_s, os.environ.get("SLURM_CONF", "")),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """The job ended: the entrypoint collects node 0's model, or reports the job's failure in one line."""
        from trainpipe.components.train_model.slurm_job import ATTACH_ENV

        if event.get("timed_out"):
            self._slurm_job = event["job_id"]
            self.on_kill()
            raise AirflowException(f"train_model: Slurm job {event['job_id']} did not end in time; cancelled it")
        self.env = {**self.env, ATTACH_ENV: event["job_id"]}
        return super().execute(context)

    def on_kill(self) -> None:
        """End the step's processes and cancel the Slurm job this task submitted."""
        super().on_kill()
        job, self._slurm_job = self._slurm_job, None
        if job:
            from trainpipe.services import slurm

            self.log.info("scancel %s", job)
            slurm.cancel(job)
