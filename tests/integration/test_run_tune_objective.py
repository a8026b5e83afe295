"""``trainpipe run [--dry-run]``: a ``tune:`` objective the study cannot read of the function's curve (``r2``
for the default median pruner, when the function logs ``val_loss``) is the command's one line, exit 2, before
the engine starts.

It was refused only at the first trial's first epoch end, after steps ran, and a dry run passed it. The
team's function logs what its source's ``ctx.log`` calls name (trainpipe.training.source_logs), so the
pipeline config's load refuses it, in the team's folder, as it refuses a built-in's. The team's package
lives only in the folder the command runs from, as in test_run_refusals.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from tests.helpers.command import trainpipe_in

pytestmark = pytest.mark.integration

TEAM = """
from typing import Any


def train(ctx: Any, config: dict) -> None:
    for x, y in ctx.batches(ctx.data.table()):
        ctx.log(val_loss=0.5)
    raise RuntimeError("a refused config never trains")
"""
TEAM_FUNCTION = "myteam52.train:train"
R2 = {
    "n_trials": 2,
    "objectives": [{"metric": "r2"}],
    "space": {"batch_size": {"type": "categorical", "choices": [8, 16]}},
}
#: What the command says: the field, what the function logs, what the pruner would have read.
SAID = {
    TEAM_FUNCTION: "field 'tune.objectives': myteam52.train:train logs val_loss each epoch, not 'r2', which the median",
    "builtin:mlp": "field 'tune.objectives': builtin:mlp logs loss each epoch (regression), not 'r2', which the median",
}


def _folder(root: Path, function: str, tune: dict) -> Path:
    (root / "myteam52").mkdir(parents=True)
    (root / "myteam52" / "__init__.py").write_text("", encoding="utf-8")
    (root / "myteam52" / "train.py").write_text(TEAM, encoding="utf-8")
    (root / "d.csv").write_text("a,b,y\n" + "".join(f"{i},{i % 3},{i * 0.5}\n" for i in range(40)), encoding="utf-8")
    config = {
        "data": str(root / "d.csv"),
        "label_column": "y",
        "workspace": str(root / "ws"),
        "train": {"train_function": function, "task": "regression", "nproc_per_node": 1, "epochs": 1},
        "tune": tune,
    }
    (root / "pipeline.yaml").write_text(json.dumps(config), encoding="utf-8")
    return root


def _run(folder: Path, engine: str, *extra: str) -> subprocess.CompletedProcess:
    return trainpipe_in(folder, "run", "--config", "pipeline.yaml", "--engine", engine, *extra)


@pytest.mark.parametrize(
    ("function", "engine", "extra"),
    [
        (TEAM_FUNCTION, "kfp-local", ("--dry-run",)),
        (TEAM_FUNCTION, "kfp-local", ()),
        ("builtin:mlp", "airflow-local", ("--dry-run",)),
    ],
    ids=["team, kfp-local dry run", "team, kfp-local run", "built-in, airflow-local dry run"],
)
def test_an_objective_the_pruner_cannot_watch_is_the_commands_one_line(tmp_path, function, engine, extra):
    proc = _run(_folder(tmp_path, function, R2), engine, *extra)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert SAID[function] in last, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ws" / "dry-run").exists() and not (tmp_path / "ws" / "kfp-local").exists(), (
        "the engine started"
    )


@pytest.fixture(autouse=True)
def _forget_the_team():
    """Each test's team package is its own folder's: none stays imported from another test."""
    yield
    for name in [m for m in sys.modules if m == "myteam52" or m.startswith("myteam52.")]:
        del sys.modules[name]


@pytest.mark.parametrize("engine", ["kfp-local", "airflow-local"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_the_same_refusal_in_process_before_the_engine_on_both_engines(tmp_path, monkeypatch, capsys, engine, dry_run):
    """``trainpipe run``'s own function from the team's folder: refused by the config's load, so no engine runs."""
    from trainpipe.app import cli

    folder = _folder(tmp_path, TEAM_FUNCTION, R2)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))  # as the command puts its folder first (trainpipe.app.command)
    monkeypatch.setattr(cli, "run_engine", lambda *a: pytest.fail("the engine started"))
    with pytest.raises(typer.Exit) as exited:
        cli.run_pipeline(Path("pipeline.yaml"), engine, dry_run)
    assert exited.value.exit_code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert SAID[TEAM_FUNCTION] in line, line


def test_what_the_function_logs_or_no_pruner_is_taken(tmp_path, monkeypatch):
    """The same function tuned on what it logs, or on r2 without the pruner (scored once a trial ends): loaded."""
    from trainpipe.pipelines.config import load_pipeline_config

    folder = _folder(tmp_path, TEAM_FUNCTION, R2)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    config = json.loads((folder / "pipeline.yaml").read_text(encoding="utf-8"))
    for objectives, pruner in (([{"metric": "val_loss", "direction": "minimize"}], None), ([{"metric": "r2"}], "none")):
        config["tune"] = {**R2, "objectives": objectives, **({"pruner": pruner} if pruner else {})}
        (folder / "pipeline.yaml").write_text(json.dumps(config), encoding="utf-8")
        assert load_pipeline_config(Path("pipeline.yaml")).tune is not None
