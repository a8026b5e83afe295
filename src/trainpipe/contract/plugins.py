"""MLflow's request-header plugins, loaded when they are used rather than when MLflow is imported.

Feast (0.67) registers an ``mlflow.request_header_provider`` entry point, and MLflow loads every such
plugin when it is imported: every process that imports MLflow — each step that logs or registers, each
rank that reports — imported all of Feast with it, about 3.5 s of one core and its memory, although the
provider adds a header only inside Feast's own calls (while Feast's token context is set, which needs Feast
imported). :func:`defer_feast_headers` has MLflow register a stand-in for it instead: the same provider,
asked only once Feast's module is loaded. Every other plugin, and every other entry-point group, is
untouched.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from typing import Any

GROUP = "mlflow.request_header_provider"
#: Feast's provider, as its distribution declares it.
FEAST_PROVIDER = "feast.infra.data_sources.mlflow.auth:FeastMLflowHeaderProvider"
_FEAST_MODULE = FEAST_PROVIDER.partition(":")[0]


class FeastHeaders:
    """Feast's request-header provider, consulted only where Feast's module is already loaded (nowhere
    else can its token context be set)."""

    def _provider(self) -> Any:
        module = sys.modules.get(_FEAST_MODULE)
        return None if module is None else module.FeastMLflowHeaderProvider()

    def in_context(self) -> bool:
        provider = self._provider()
        return bool(provider is not None and provider.in_context())

    def request_headers(self) -> dict[str, str]:
        provider = self._provider()
        return {} if provider is None else dict(provider.request_headers())


STAND_IN = importlib.metadata.EntryPoint(name="feast", value=f"{__name__}:FeastHeaders", group=GROUP)


def _deferring(entry_points: Any) -> Any:
    @functools.wraps(entry_points)
    def wrapper(**params: Any) -> Any:
        found = entry_points(**params)
        if params.get("group") != GROUP or not any(e.value == FEAST_PROVIDER for e in found):
            return found
        return importlib.metadata.EntryPoints(STAND_IN if e.value == FEAST_PROVIDER else e for e in found)

    wrapper.trainpipe_defers_feast = True  # type: ignore[attr-defined]
    return wrapper


def defer_feast_headers() -> None:
    """Before MLflow is imported: its plugin lookup gets the stand-in for Feast's header provider.

    Idempotent; without effect where MLflow is already imported (its plugins are registered then)."""
    if "mlflow" in sys.modules or getattr(importlib.metadata.entry_points, "trainpipe_defers_feast", False):
        return
    importlib.metadata.entry_points = _deferring(importlib.metadata.entry_points)
