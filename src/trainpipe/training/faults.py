"""Fault injection for tests (``TRAINPIPE_FAULT``), honoured on a run's first attempt only: not in a restart of
the worker group, nor in a retry of the task (its try number, ``TRAINPIPE_TRY_NUMBER``, above 1)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

from trainpipe.contract.errors import InputError
from trainpipe.contract.push import TRY_ENV

FAULT_ENV = "TRAINPIPE_FAULT"
#: Preemptions a step took in this try before this run (set by the Airflow operator that runs it again:
#: trainpipe.faces.airflow_operator.PREEMPTION_ENV).
PREEMPTIONS_ENV = "TRAINPIPE_PREEMPTION"


def attempt() -> int:
    """Which restart of the worker group this is (0 for the first run)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("TRAINPIPE_ATTEMPT") or 0)


@dataclass
class Fault:
    """A fault to inject, from ``TRAINPIPE_FAULT``.

    ``kill:RANK:STEP`` SIGKILLs rank RANK before global step STEP, once the checkpoints it has
    started are written (so the step a retry resumes from does not depend on the machine's load);
    ``kill_checkpoint:STEP`` SIGKILLs rank 0 half way through writing checkpoint STEP (its data
    written, its metadata not); ``preempt:STEP`` has every rank take a SIGTERM before global step STEP
    (as the launcher's forwarding would, but at the same step on every machine): any step, the last included;
    ``preempt:STEP:TIMES`` does so (at the first step at or after STEP) in each of the first TIMES runs of the step
    within one try (an Airflow task
    runs a preempted step again without a retry: ``TRAINPIPE_PREEMPTION`` counts them);
    ``preempt:after`` has train_model's own process take a SIGTERM once its ranks finished, as it logs the
    model (a platform's stop that comes just after the last step).
    """

    kind: str = ""
    rank: int = -1
    step: int = -1
    times: int = 1
    fired: bool = False

    @classmethod
    def from_env(cls) -> Fault:
        raw = os.environ.get(FAULT_ENV, "")
        if not raw or attempt() > 0 or int(os.environ.get(TRY_ENV) or 1) > 1:
            return cls()
        parts = raw.split(":")
        taken = int(os.environ.get(PREEMPTIONS_ENV) or 0)  # a preempted step's runs again in the same try
        try:
            if parts[0] == "preempt" and len(parts) == 3:
                return cls("preempt", 0, int(parts[1]), int(parts[2])) if taken < int(parts[2]) else cls()
            if taken:
                return cls()
            if parts[0] == "kill" and len(parts) == 3:
                return cls("kill", int(parts[1]), int(parts[2]))
            if parts[0] == "preempt" and parts[1:] == ["after"]:
                return cls("preempt_after")
            if parts[0] in ("kill_checkpoint", "preempt") and len(parts) == 2:
                return cls(parts[0], 0, int(parts[1]))
        except ValueError:
            pass
        raise InputError(
            f"{FAULT_ENV}: {raw!r} is not kill:RANK:STEP, kill_checkpoint:STEP, preempt:STEP, preempt:STEP:TIMES "
            "or preempt:after"
        )

    def maybe_preempt(self, step: int) -> None:
        """Take a SIGTERM now, on this rank, when the fault names this step."""
        # with TIMES, at the first step at or after STEP: a run resumed from that checkpoint starts past it
        if self.kind == "preempt" and (self.step == step or (self.times > 1 and step >= self.step and not self.fired)):
            self.fired = True
            from trainpipe.training import control

            control.request(signal.SIGTERM)

    def after_training(self) -> None:
        """Take a SIGTERM now, in train_model's own process, when the fault is ``preempt:after``."""
        if self.kind == "preempt_after":
            os.kill(os.getpid(), signal.SIGTERM)

    def maybe_kill(self, kind: str, rank: int, step: int, before: Callable[[], None] | None = None) -> None:
        """SIGKILL this process when the fault names this moment (after ``before``)."""
        if self.kind == kind and self.rank == rank and self.step == step:
            if before is not None:
                before()
            print(f"train_model rank {rank}: injected fault {kind} at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
