"""The ``trainpipe`` command's entry point.

``trainpipe <component> ...`` becomes the component's entrypoint at once, before the CLI (typer and its
commands) is loaded: the same process and the same start-up as ``python -m trainpipe.components.<component>``.
Anything else is the CLI (:mod:`trainpipe.app.cli`).
"""

from __future__ import annotations

import sys

from trainpipe import COMPONENTS
from trainpipe.app.component import run_component


def main() -> None:
    """``trainpipe``: a component's subcommand goes straight to its entrypoint; the rest to the CLI."""
    if len(sys.argv) > 1 and sys.argv[1] in COMPONENTS:
        run_component(sys.argv[1], sys.argv[2:])
    from trainpipe.app.cli import app

    app()
