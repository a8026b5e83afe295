"""The Airflow triggerer's side of a Slurm job: polls ``scontrol show job`` while no worker slot is held.

Imported only when a task defers (never when a DAG file is parsed). The triggerer must reach the
cluster the way the worker does: Slurm's tools on its PATH and the same ``SLURM_CONF``, which the
trigger carries (a path, never a secret).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from trainpipe.services import slurm


class SlurmJobTrigger(BaseTrigger):
    """Fires once the Slurm job ends (a requeued job is still running), or when ``timeout_s`` passes.

    Args:
        job_id: The job to watch.
        poll_s: Seconds between polls.
        timeout_s: Give up after this long (the task then cancels the job).
        slurm_conf: ``SLURM_CONF`` of the cluster (default: the triggerer's own).
    """

    def __init__(self, job_id: str, poll_s: float = 5.0, timeout_s: float = 86_400.0, slurm_conf: str = "") -> None:
        super().__init__()
        self.job_id, self.poll_s, self.timeout_s, self.slurm_conf = job_id, poll_s, timeout_s, slurm_conf

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"job_id": self.job_id, "poll_s": self.poll_s, "timeout_s": self.timeout_s, "slurm_conf": self.slurm_conf},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        env = {**os.environ, **({"SLURM_CONF": self.slurm_conf} if self.slurm_conf else {})}
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                job = await asyncio.to_thread(slurm.show, self.job_id, env)
            except Exception as exc:  # the controller is briefly away: keep polling until the deadline
                self.log.warning("slurm: polling job %s: %s", self.job_id, exc)
                job = slurm.Job(self.job_id, "PENDING")
            if job is None or not job.active:
                state = job.state if job is not None else "UNKNOWN"
                self.log.info("slurm: job %s ended %s", self.job_id, state)
                yield TriggerEvent({"job_id": self.job_id, "state": state, "timed_out": False})
                return
            if time.monotonic() > deadline:
                yield TriggerEvent({"job_id": self.job_id, "state": job.state, "timed_out": True})
                return
            await asyncio.sleep(self.poll_s)
