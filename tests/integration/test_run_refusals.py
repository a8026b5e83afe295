"""``trainpipe run`` from a team's own folder: a mistake in the team's config is the command's one line, exit 2.

The engine and every step run as ``python -m``, which puts the current folder first on ``sys.path``; the
command once did not, so it could not import the team's package, passed the config, and the engine's
refusal ("train_config.hiden: unknown key ...") reached only the log file while the screen said "the
kfp-local engine failed before any step reported (exit 1)". The team's package here lives only in the
folder the command runs from (not on PYTHONPATH, not installed).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.command import trainpipe_in

pytestmark = pytest.mark.integration

TEAM = """
from typing import Any
from pydantic import BaseModel, ConfigDict


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = 16
    lr: float = 0.01
    dropout: float = 0.0


def train(ctx: Any, config: TrainConfig) -> None:
    raise RuntimeError("a refused config never trains")
"""
CASES = {
    "unknown key": ({"train_config": {"hiden": 8}}, None, "train_config.hiden: unknown key (TrainConfig takes"),
    "wrong type": ({"train_config": {"lr": "0.01"}}, None, "train_config.lr"),
    "tune space key": (
        {"train_config": {"lr": 0.01}},
        {"n_trials": 2, "space": {"train_config.lrr": {"type": "float", "low": 0.001, "high": 0.1}}},
        "train_config.lrr",
    ),
}


def _team_folder(root: Path, train: dict, tune: dict | None) -> Path:
    (root / "myteam").mkdir(parents=True)
    (root / "myteam" / "__init__.py").write_text("", encoding="utf-8")
    (root / "myteam" / "train.py").write_text(TEAM, encoding="utf-8")
    (root / "d.csv").write_text("a,b,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40)), encoding="utf-8")
    config = {
        "data": str(root / "d.csv"),
        "label_column": "y",
        "workspace": str(root / "ws"),
        "train": {"train_function": "myteam.train:train", "nproc_per_node": 1, "epochs": 1, **train},
    }
    if tune:
        config["tune"] = tune
    (root / "pipeline.yaml").write_text(json.dumps(config), encoding="utf-8")
    return root


def _run(folder: Path, engine: str, *extra: str) -> subprocess.CompletedProcess:
    return trainpipe_in(folder, "run", "--config", "pipeline.yaml", "--engine", engine, *extra)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_team_config_mistake_is_the_commands_one_line(tmp_path, case):
    train, tune, expected = CASES[case]
    proc = _run(_team_folder(tmp_path, train, tune), "kfp-local")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert expected in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "failed before any step reported" not in proc.stderr
    assert not (tmp_path / "ws" / "kfp-local").exists(), "a refused config ran a step"


def test_the_same_line_on_airflow_local_and_in_a_dry_run(tmp_path):
    proc = _run(_team_folder(tmp_path, *CASES["unknown key"][:2]), "airflow-local", "--dry-run")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert CASES["unknown key"][2] in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_engines_refusal_reaches_the_command_as_its_line_and_code(tmp_path, monkeypatch):
    """Where only the engine can tell (its process refuses while building the run), the engine writes the
    refusal to the failure report ``trainpipe run`` reads, and exits with the refusal's code."""
    from trainpipe.app import runner
    from trainpipe.contract.errors import InputError
    from trainpipe.faces.command import FAILURE_FILE_ENV

    def refuse(config: Path) -> int:
        raise InputError("train_config.hiden: unknown key (TrainConfig takes hidden, lr)")

    monkeypatch.setitem(runner.ENGINES, "kfp-local", refuse)
    report = tmp_path / "failure.json"
    monkeypatch.setenv(FAILURE_FILE_ENV, str(report))
    assert runner.main(["kfp-local", str(tmp_path / "pipeline.yaml")]) == 2
    assert json.loads(report.read_text(encoding="utf-8")) == {
        "component": runner.LOAD,
        "exit_code": 2,
        "message": "train_config.hiden: unknown key (TrainConfig takes hidden, lr)",
    }
