"""The one command line every face runs: ``python -m trainpipe.components.<name> …``.

Stdlib only: the KFP face calls it inside the container. The KFP face, the
Airflow operator and the KubernetesPodOperator all build their command here, so
the three can never drift from each other or from the entrypoint.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def settings_to_flags(settings: dict[str, Any]) -> list[str]:
    """``{"label_column": "y", "hidden_units": [64]}`` → ``--label-column y --hidden-units [64]``.

    Unset values (None or "") are left out, so the component's own default applies.
    """
    args: list[str] = []
    for key, value in settings.items():
        if value is None or value == "":
            continue
        args += ["--" + key.replace("_", "-"), value if isinstance(value, str) else json.dumps(value)]
    return args


def component_command(
    name: str,
    settings: dict[str, Any],
    *,
    orchestrator: str,
    run_id: str = "",
    result_path: str | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The full entrypoint command for one component run."""
    cmd = [python, "-m", f"trainpipe.components.{name}", "--orchestrator", orchestrator]
    if run_id:
        cmd += ["--run-id", run_id]
    if result_path:
        cmd += ["--result", result_path]
    return cmd + settings_to_flags(settings)
