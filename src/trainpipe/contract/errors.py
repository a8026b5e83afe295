"""One error hierarchy, one exit code per kind of failure.

Orchestrators retry only what can succeed on retry: an unreachable service is
transient; bad input, a failed data suite and a failed gate are permanent.

| exit code | meaning                                   | retried |
|-----------|-------------------------------------------|---------|
| 0         | success                                   | -       |
| 1         | internal error (a bug: traceback printed) | no      |
| 2         | bad input: config, arguments, data, paths, or a team's training function that fails | no |
| 3         | data failed its expectation suite         | no      |
| 4         | model gate not passed (when asked to fail)| no      |
| 6         | the audit log failed verification         | no      |
| 7         | a model failed signature verification (changed after signing, another key, or unsigned where required) |
no |
| 8         | the step's job was cancelled or deleted outside trainpipe (scancel, kubectl delete) | no |
| 9         | a training reached its budget (max_cost, max_gpu_hours) | no |
| 10        | the serving alias moved after the gate compared: another holder than the one it beat | no |
| 75        | a service is unreachable, or the step was preempted (SIGTERM, SIGUSR1) after writing a checkpoint
(EX_TEMPFAIL) | yes |
| 77        | not permitted: credentials or rights (EX_NOPERM) | no |
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_VALIDATION_FAILED = 3
EXIT_GATE_FAILED = 4
EXIT_AUDIT_TAMPERED = 6
EXIT_SIGNATURE_INVALID = 7
EXIT_CANCELLED = 8
EXIT_BUDGET = 9
EXIT_ALIAS_MOVED = 10
EXIT_TRANSIENT = 75
EXIT_NOT_PERMITTED = 77

#: Exit codes an orchestrator may retry. A process killed by a signal
#: (exit status > 128, or negative from subprocess) is also retryable.
RETRYABLE_EXIT_CODES = frozenset({EXIT_TRANSIENT})


class TrainpipeError(Exception):
    """Base of every error trainpipe reports to a user as one line."""

    exit_code = EXIT_INTERNAL
    retryable = False


class InputError(TrainpipeError):
    """Bad config, arguments, paths or data: permanent."""

    exit_code = EXIT_BAD_INPUT


class UserCodeError(InputError):
    """A team's training function raised: permanent, a rerun runs the same code.

    Its message is one line; ``detail`` keeps the team's whole error (its full message and traceback) for the log.
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class ValidationFailed(TrainpipeError):
    """The data did not pass its expectation suite: permanent."""

    exit_code = EXIT_VALIDATION_FAILED


class GateFailed(TrainpipeError):
    """The model did not pass its gate: permanent."""

    exit_code = EXIT_GATE_FAILED


class AuditTampered(TrainpipeError):
    """The audit log's hash chain is broken: a record was edited, removed or reordered."""

    exit_code = EXIT_AUDIT_TAMPERED


class SignatureInvalid(TrainpipeError):
    """A model's signature does not verify: it was changed after signing, signed by another key, or
    is unsigned where the platform requires a signature. Permanent: a rerun reads the same bytes."""

    exit_code = EXIT_SIGNATURE_INVALID


class Cancelled(TrainpipeError):
    """The job the step submitted was cancelled or deleted by someone else (``scancel``, ``kubectl delete``):
    permanent, a person stopped it; a retry would submit it again against their decision."""

    exit_code = EXIT_CANCELLED


class BudgetReached(TrainpipeError):
    """A training reached its budget (``max_cost``, ``max_gpu_hours``) and stopped at a step's end with
    its checkpoint written: not retried (the same budget is spent), a rerun with a larger one resumes."""

    exit_code = EXIT_BUDGET


class AliasMoved(TrainpipeError):
    """register_model would move the serving alias, but its holder is not the version the gate compared
    the model with (another registration or a promotion moved it since): the model stays challenger.
    Permanent: a retry of the step reads the same decision; evaluating again compares with the new holder."""

    exit_code = EXIT_ALIAS_MOVED


class Preempted(TrainpipeError):
    """The platform asked the step to stop (SIGTERM: a pod deleted, a preemption, a spot node
    reclaimed; SIGUSR1: Slurm's warning) and it did at a step's end, its checkpoint written first:
    transient, a retry resumes from that checkpoint."""

    exit_code = EXIT_TRANSIENT
    retryable = True

    def __init__(self, message: str, *, step: int | None = None, checkpoint: str | None = None) -> None:
        super().__init__(message)
        #: The step the ranks stopped at, and the checkpoint a retry resumes from (None: none was written).
        self.step, self.checkpoint = step, checkpoint


class NotPermitted(TrainpipeError):
    """A service refused the credentials or the identity lacks the right: permanent until someone grants it."""

    exit_code = EXIT_NOT_PERMITTED


class ServiceUnavailable(TrainpipeError):
    """A service (tracking server, remote) could not be reached: transient."""

    exit_code = EXIT_TRANSIENT
    retryable = True


def is_retryable_exit(code: int) -> bool:
    """Whether an orchestrator should retry a step that exited with ``code``.

    Args:
        code: The process exit status (negative for a signal, as subprocess reports it).

    Returns:
        True for transient failures and for processes killed by a signal.
    """
    return code in RETRYABLE_EXIT_CODES or code < 0 or code > 128
