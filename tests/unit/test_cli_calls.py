"""A command never calls another typer command as a plain function.

A typer command's parameters default to typer's ``Option``/``Argument`` objects, which are truthy: ``demo``
called ``run(config=..., engine=...)`` and so ran with ``dry_run`` set to an ``Option``, a dry run that
trained nothing while ``make demo`` exited 0. A command that needs another's work calls the plain function
both share (``run_pipeline``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trainpipe.app

pytestmark = pytest.mark.unit

APP = Path(trainpipe.app.__file__).parent


def _commands(tree: ast.Module) -> set[str]:
    """Functions decorated with ``<typer>.command(...)`` or ``<typer>.callback(...)``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                call = dec.func if isinstance(dec, ast.Call) else dec
                if isinstance(call, ast.Attribute) and call.attr in ("command", "callback"):
                    names.add(node.name)
    return names


def _calls_to(tree: ast.Module, names: set[str]) -> list[str]:
    return [
        f"line {node.lineno}: {node.func.id}(...)"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
    ]


def test_no_command_calls_another_command_as_a_function():
    for path in sorted(APP.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        commands = _commands(tree)
        assert not _calls_to(tree, commands), f"{path.name} calls a typer command as a function"


def test_the_check_sees_the_demo_defect():
    """The check itself, on the shape that made ``make demo`` a dry run."""
    tree = ast.parse(
        "@app.command()\ndef run(dry_run: bool = typer.Option(False)): ...\n"
        "@app.command()\ndef demo():\n    run(engine='kfp-local')\n"
    )
    assert _calls_to(tree, _commands(tree)) == ["line 5: run(...)"]


def test_demo_runs_the_pipeline_for_real_not_dry(monkeypatch, tmp_path):
    """``demo`` hands ``run_pipeline`` ``dry_run=False`` (what the command saw, in process: no pipeline runs)."""
    from trainpipe.app import cli

    seen = {}
    monkeypatch.setattr(cli, "run_pipeline", lambda config, engine, dry_run: seen.update(engine=engine, dry=dry_run))
    monkeypatch.setattr("trainpipe.demo.write_demo_config", lambda ws, profile: tmp_path / "pipeline.yaml")
    from typer.testing import CliRunner

    result = CliRunner().invoke(cli.app, ["demo", "--engine", "airflow-local"])
    assert result.exit_code == 0, result.output
    assert seen == {"engine": "airflow-local", "dry": False}
