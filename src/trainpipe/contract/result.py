"""What every component's result is: its own fields, the lineage it carries on, the one line the
entrypoint prints, and the audit events beyond the execution itself (a gate decision, an alias
moved). Stdlib and pydantic only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from trainpipe.contract.lineage import Lineage


class ComponentResult(BaseModel):
    """The base of every ``<Name>Result``."""

    lineage: Lineage = Field(default_factory=Lineage, description="the record from the raw data to this step")

    def summary(self) -> str:
        """One line for the log: what this step did."""
        raise NotImplementedError(f"{type(self).__name__} must say what the step did in summary()")

    def figures(self) -> dict[str, float]:
        """The batch-job figures pushed to the Pushgateway besides duration and exit code:
        ``rows`` read or scored, ``bytes`` written or hashed, where the step knows them."""
        return {}

    def series(self) -> list[tuple[str, str, dict[str, str], float]]:
        """Figures of the step's own, pushed beside the batch-job figures: ``(metric, help,
        labels, value)`` each (detect_drift's share and per-column statistics). Labels name data,
        never a secret."""
        return []

    def audit_events(self) -> list[dict[str, Any]]:
        """Audit records besides the execution itself (a gate decision, an alias change)."""
        return []


class ErrorRecord(BaseModel):
    """What a failed step writes where ``--error-record`` says: the record its runner reads (a KFP body, an
    Airflow task, a tune_model trial, ``trainpipe run``) instead of parsing the step's log."""

    component: str = Field(description="the step that failed")
    exit_code: int = Field(description="its documented exit code (trainpipe.contract.errors)")
    message: str = Field(description="the one line it printed, without its 'trainpipe <step>: error: ' prefix")

    @classmethod
    def read(cls, path: str | Path) -> ErrorRecord | None:
        """The record at ``path``; None when the step wrote none (it was killed, or never started)."""
        try:
            return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    @classmethod
    def explain(cls, component: str, code: int, path: str | Path) -> str:
        """A failed step's one line: its record's message or, where it wrote none (a signal, the kernel's OOM
        killer, a crash before it began), what its exit status says."""
        record = cls.read(path)
        if record is not None:
            return record.message
        if code < 0:
            return f"{component} was killed by signal {-code} and wrote no error record"
        return f"{component} exited {code} and wrote no error record (it ended before it began, or was killed)"

    def write(self, path: str | Path) -> None:
        """Atomically, so a runner never reads half a record (or to the descriptor a runner handed down)."""
        from trainpipe.contract.io import write_record

        write_record(path, self.model_dump())
