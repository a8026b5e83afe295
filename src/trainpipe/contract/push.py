"""A component's batch-job figures, pushed to a Pushgateway when its run ends (the entrypoint does it
for every component). Never fails a run: a Pushgateway down is one warning line on stderr.

Stdlib at import; prometheus_client (pure Python) is imported only when pushing.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from trainpipe.contract.text import redact

#: The Pushgateway components push their batch-job figures to (unset: none is pushed).
PUSHGATEWAY_ENV = "TRAINPIPE_PUSHGATEWAY"
#: Which try of the task this is (the Airflow faces set it from the task instance; default 1).
TRY_ENV = "TRAINPIPE_TRY_NUMBER"

#: The Pushgateway job name; the grouping key adds the component and the run id, so a rerun of the
#: same run replaces its figures instead of adding a second set.
PUSH_JOB = "trainpipe"


def warn(message: str) -> None:
    """Telemetry's one warning line (it never raises)."""
    print(f"trainpipe telemetry: warning: {message}", file=sys.stderr, flush=True)


def label(value: Any) -> str:
    """A label value as Prometheus gets it (empty for None, at most 128 characters)."""
    return str(value if value is not None else "")[:128]


def push_component(
    name: str,
    exit_code: int,
    seconds: float,
    run_id: str | None,
    figures: dict[str, float],
    hardware_profile: str,
    url: str | None = None,
    series: list[tuple[str, str, dict[str, str], float]] | None = None,
) -> bool:
    """Push one component run's figures to the Pushgateway (``TRAINPIPE_PUSHGATEWAY``), if one is set.

    Grouped by job ``trainpipe``, the component and the run id, and pushed with PUT: a rerun or a
    retry of the same run replaces the figures. ``series`` are the step's own figures
    (``(metric, help, labels, value)``, :meth:`ComponentResult.series`). Returns whether they were pushed.
    """
    url = url or os.environ.get(PUSHGATEWAY_ENV)
    if not url:
        return False
    try:
        from prometheus_client import CollectorRegistry, push_to_gateway
        from prometheus_client.core import GaugeMetricFamily
    except ImportError:
        warn("prometheus_client is not installed; the component's figures were not pushed")
        return False
    try:
        attempt = max(int(os.environ.get(TRY_ENV) or 1), 1)
    except ValueError:
        attempt = 1
    labels = {"hardware_profile": label(hardware_profile)}
    # Metric families, not Gauge objects: a Gauge's value follows prometheus_client's process-wide mode,
    # which a library imported earlier can switch to multiprocess files (feast.metrics does, on import).
    families: dict[str, Any] = {}

    def put(metric: str, doc: str, value: float | None, extra: dict[str, str] | None = None) -> None:
        if value is None:
            return
        both = {**labels, **(extra or {})}
        keys = sorted(both) if extra is not None else list(both)
        family = families.get(metric) or families.setdefault(metric, GaugeMetricFamily(metric, doc, labels=keys))
        family.add_metric([label(both[k]) for k in keys], float(value))

    put("trainpipe_component_duration_seconds", "wall time of the component's run", seconds)
    put("trainpipe_component_exit_code", "the run's exit code (0 ok, 2 bad input, 75 service down, ...)", exit_code)
    put("trainpipe_component_success", "1 if the run succeeded", 1.0 if exit_code == 0 else 0.0)
    put("trainpipe_component_retries", "earlier tries of this task", attempt - 1)
    put("trainpipe_component_rows", "rows the component read or scored", figures.get("rows"))
    put("trainpipe_component_bytes", "bytes the component wrote or hashed", figures.get("bytes"))
    put("trainpipe_component_last_run_timestamp_seconds", "when the run ended (unix time)", time.time())
    for metric, doc, extra, value in series or []:
        put(metric, doc, value, {k: str(v) for k, v in extra.items()})

    class Families:
        def collect(self) -> Any:
            return list(families.values())

    registry = CollectorRegistry()
    registry.register(Families())
    try:
        push_to_gateway(
            url,
            job=PUSH_JOB,
            registry=registry,
            timeout=3,
            grouping_key={"component": name, "run_id": label(run_id) or "manual"},
        )
    except Exception as exc:  # noqa: BLE001 (telemetry never fails a run)
        reason = getattr(exc, "reason", None) or exc
        warn(
            f"{PUSHGATEWAY_ENV}: cannot push {name}'s figures to {redact(url)} "
            f"({str(reason).splitlines()[0][:200] if str(reason) else type(exc).__name__})"
        )
        return False
    return True
