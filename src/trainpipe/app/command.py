"""The ``trainpipe`` command's entry point.

``trainpipe <component> ...`` becomes the component's entrypoint at once, before the CLI (typer and its
commands) is loaded: the same process and the same start-up as ``python -m trainpipe.components.<component>``.
Anything else is the CLI (:mod:`trainpipe.app.cli`).
"""

from __future__ import annotations

import os
import sys

from trainpipe import COMPONENTS
from trainpipe.app.component import run_component


def main() -> None:
    """``trainpipe``: a component's subcommand goes straight to its entrypoint; the rest to the CLI."""
    if len(sys.argv) > 1 and sys.argv[1] in COMPONENTS:
        run_component(sys.argv[1], sys.argv[2:])
    # the team's packages are found where its steps find them: `python -m` (each step, the engine) puts the current
    # folder first on sys.path, so the command checks a team's config with the same code its engine runs
    sys.path.insert(0, os.getcwd())
    from trainpipe.app.cli import app

    app()
