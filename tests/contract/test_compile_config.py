"""`trainpipe compile --config` (issue 52): the config's values are the compiled pipeline's parameter defaults,
a place on this machine is left for the run to pass (one line on stderr), and a team function that cannot be
imported here is named in a warning that its config was not checked. In process, through the command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trainpipe.pipelines.compile import validate_pipeline_yaml

pytestmark = pytest.mark.contract

#: A team's config, as the issue's user wrote it: its identity (label, names, thresholds) and places a cluster reaches.
CLUSTER_CONFIG: dict[str, Any] = {
    "data": "s3://team-bucket/cancer/raw.parquet",
    "label_column": "diagnosis",
    "model_name": "cancer-model",
    "dataset_name": "cancer-biopsies",
    "experiment_name": "cancer",
    "thresholds": {"accuracy": 0.9},
    "tracking_uri": "https://mlflow.example.org",
    "dvc_remote_url": "s3://team-bucket/dvc",
    "train": {"train_function": "cancerteam.train:fit", "train_config": {"hidden": 4}, "epochs": 3},
}

TEAM_MODULE = """
from typing import Any
from pydantic import BaseModel, ConfigDict


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = 8


def fit(ctx: Any, config: Config) -> None:
    ctx.log(accuracy=1.0)  # what a tune section's default objective reads each epoch
"""


@pytest.fixture
def team(tmp_path, monkeypatch):
    """The team's package (a typed config), importable here, and a folder for its pipeline config."""
    from trainpipe.training import config_types

    (tmp_path / "site" / "cancerteam").mkdir(parents=True)
    (tmp_path / "site" / "cancerteam" / "__init__.py").write_text("")
    (tmp_path / "site" / "cancerteam" / "train.py").write_text(TEAM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    config_types.config_model.cache_clear()
    folder = tmp_path / "team"
    folder.mkdir()
    monkeypatch.chdir(folder)
    yield folder
    config_types.config_model.cache_clear()


def _compile(folder: Path, config: dict[str, Any]) -> tuple[Any, Path]:
    from typer.testing import CliRunner

    from trainpipe.app.cli import app

    (folder / "pipeline.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    out = folder / "out" / "pipeline.kfp.yaml"
    result = CliRunner().invoke(app, ["compile", "--config", str(folder / "pipeline.yaml"), "-o", str(out)])
    return result, out


def _defaults(path: Path) -> dict[str, Any]:
    """The pipeline's parameters and their defaults, as kfp's own loader reads them (no default: ``...``)."""
    from kfp.components import load_component_from_file

    inputs = load_component_from_file(str(path)).component_spec.inputs
    return {name: (spec.default if spec.optional else ...) for name, spec in inputs.items()}


def test_the_configs_values_are_the_compiled_pipelines_defaults(team):
    """Before: label_column defaulted to ``label`` and model_name to ``trainpipe-model``: a run with the defaults
    trained on the wrong column and registered under another name."""
    from trainpipe.pipelines.config import load_pipeline_config

    result, out = _compile(team, CLUSTER_CONFIG)
    assert result.exit_code == 0, result.output
    # the function importable: no warning; the DVC working clone's default lies under this machine's workspace
    assert result.stderr.splitlines() == [
        "trainpipe compile: places on this machine or holding a password not compiled in, so a run must pass them "
        "as parameters (a cluster's pods cannot read this machine; no secret goes into a compiled pipeline): "
        f"dvc_repo_dir={team}/.trainpipe/dvc-repo"
    ]
    validate_pipeline_yaml(out)
    ir = next(yaml.safe_load_all(out.read_text()))
    declared = ir["root"]["inputDefinitions"]["parameters"]
    assert declared["label_column"]["defaultValue"] == "diagnosis"
    assert declared["model_name"]["defaultValue"] == "cancer-model"
    assert declared["dataset_name"]["defaultValue"] == "cancer-biopsies"
    assert declared["thresholds"]["defaultValue"] == {"accuracy": 0.9}
    assert declared["train_config"]["defaultValue"] == '{"hidden": 4}'  # JSON text: its types kept
    # every parameter: what `trainpipe schedule --config` passes a run is what a run with the defaults gets
    expected = load_pipeline_config(team / "pipeline.yaml").pipeline_arguments()
    assert _defaults(out) == {**expected, "dvc_repo_dir": ...}


def test_places_on_this_machine_are_left_for_the_run_and_said_in_one_line(team):
    """Before: the tune storage compiled in as ``sqlite:////<this machine's workspace>/tune/study.db``."""
    (team / "suite.json").write_text("{}")
    config = {
        **CLUSTER_CONFIG,
        "data": "raw.csv",
        "suite": "suite.json",
        "tracking_uri": "http://localhost:5000",
        "tune": {"space": {"train_config.hidden": {"type": "int", "low": 2, "high": 8}}},
    }
    result, out = _compile(team, config)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert str(team) not in text and "localhost" not in text and "sqlite" not in text
    validate_pipeline_yaml(out)
    defaults = _defaults(out)
    left = ("data", "suite", "tracking_uri", "dvc_repo_dir", "tune_storage")
    assert {name for name, value in defaults.items() if value is ...} == set(left)
    assert defaults["model_name"] == "cancer-model" and defaults["dvc_remote_url"] == "s3://team-bucket/dvc"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainpipe compile: places on this machine"), result.stderr
    assert all(f"{name}=" in lines[0] for name in left)
    assert f"tune_storage=sqlite:///{team}/.trainpipe/tune/study.db" in lines[0]


def test_a_local_database_is_left_to_the_run_and_its_password_never_shown(team):
    config = {**CLUSTER_CONFIG, "tracking_uri": "postgresql://mlflow:s3cret@127.0.0.1/mlflow"}
    result, out = _compile(team, config)
    assert result.exit_code == 0, result.output
    assert _defaults(out)["tracking_uri"] is ... and "tracking_uri=postgresql://***@127.0.0.1/mlflow" in result.stderr
    assert "s3cret" not in result.output and "s3cret" not in out.read_text()


def test_a_shared_tune_storage_is_compiled_in(team):
    storage = "postgresql+psycopg2://tune@db.example.org/tune"
    config = {**CLUSTER_CONFIG, "tune": {"storage": storage, "space": {"batch_size": {"type": "int", "low": 8}}}}
    config["tune"]["space"]["batch_size"]["high"] = 64
    result, out = _compile(team, config)
    assert result.exit_code == 0, result.output
    assert "tune_storage" not in _defaults(out) and f"constant: {storage}" in out.read_text()


def test_a_team_function_not_importable_here_is_named_in_a_warning(team):
    """Before: a typo in the config of a function this machine cannot import compiled without a word."""
    config = {**CLUSTER_CONFIG, "train": {"train_function": "elsewhere.train:fit", "train_config": {"hiden": 4}}}
    result, out = _compile(team, config)
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if line.startswith("trainpipe compile: warning:")]
    assert len(warned) == 1 and warned[0].startswith("trainpipe compile: warning: train_function 'elsewhere.train:fit'")
    assert "not checked" in warned[0]
    assert _defaults(out)["train_config"] == '{"hiden": 4}'  # compiled as written; train_model refuses it


def test_an_importable_team_function_has_its_config_checked(team):
    config = {**CLUSTER_CONFIG, "train": {"train_function": "cancerteam.train:fit", "train_config": {"hiden": 4}}}
    result, out = _compile(team, config)
    assert result.exit_code == 2, result.output
    assert "hiden" in result.stderr and len(result.stderr.splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize(
    ("place", "local"),
    [
        ("/home/me/raw.csv", True),
        ("file:///home/me/raw.csv", True),
        ("sqlite:////home/me/mlflow.db", True),
        ("sqlite:///mlflow.db", True),
        ("http://localhost:5000", True),
        ("http://127.0.0.1:5000", True),
        ("postgresql://tune@[::1]/tune", True),
        ("s3://bucket/raw.parquet", False),
        ("https://mlflow.example.org", False),
        ("postgresql+psycopg2://tune@db/tune", False),
        ("builtin:default", False),
        ("", False),
    ],
)
def test_which_places_are_this_machines(place, local):
    from trainpipe.pipelines.compile import on_this_machine

    assert on_this_machine(place) is local


def test_a_password_in_a_remote_uri_is_never_compiled_in(team):
    """Before: a tracking URI or tune storage with a password, off this machine, compiled in as a default: a secret
    in the pipeline YAML that is uploaded to Kubeflow."""
    config = {
        **CLUSTER_CONFIG,
        "tracking_uri": "postgresql://mlflow:s3cret@db.example.com/mlflow",
        "tune": {
            "storage": "postgresql://optuna:hunter2@db.example.com/optuna",
            "space": {"train_config.hidden": {"type": "int", "low": 2, "high": 8}},
        },
    }
    result, out = _compile(team, config)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "s3cret" not in text and "hunter2" not in text
    assert "s3cret" not in result.output and "hunter2" not in result.output
    defaults = _defaults(out)
    assert defaults["tracking_uri"] is ... and defaults["tune_storage"] is ...
    assert "tracking_uri=postgresql://***@db.example.com/mlflow" in result.stderr
