"""A new SQLite tracking store starts as a copy of an empty one this machine's MLflow migrated once.

MLflow migrates a new SQLite file from its first schema on (about 1,800 statements, seconds), which the first
step of every new workspace paid (the demo's detect_drift: most of its 7 s). The copy must be a store MLflow
itself would have made: the same tables and migration version, the default experiment created on open with
this store's own artifact root, runs logged and read back; a store that exists is never touched.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


TABLES = "select type, name, sql from sqlite_master where name not like 'sqlite_%'"
EXPERIMENTS = "select experiment_id, name, artifact_location, lifecycle_stage from experiments"


def _normalized(db: Path) -> tuple:
    """Tables (their definitions' lines in any order: SQLAlchemy writes a table's constraints in set order),
    experiments and the migration version."""
    con = sqlite3.connect(db)
    try:
        schema = {
            name: (kind, sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()))
            for kind, name, sql in con.execute(
                "select type, name, sql from sqlite_master where name not like 'sqlite_%'"
            )
        }
        experiments = list(
            con.execute("select experiment_id, name, artifact_location, lifecycle_stage from experiments")
        )
        version = list(con.execute("select version_num from alembic_version"))
    finally:
        con.close()
    return schema, experiments, version


def test_a_seeded_store_is_the_store_mlflow_would_have_made(tmp_path, monkeypatch):
    import mlflow

    from trainpipe.services import tracking

    monkeypatch.setenv(tracking.STORE_CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    tracking.connect(f"sqlite:///{tmp_path / 'first.db'}")  # makes the template, then the store from it
    (template,) = (tmp_path / "cache" / "mlflow-stores").glob("empty-mlflow-*.db")
    assert _normalized(template)[1] == [], "the template holds no experiment: MLflow makes the default on open"

    seeded = tmp_path / "seeded.db"
    client = tracking.connect(f"sqlite:///{seeded}")
    mlflow.MlflowClient(f"sqlite:///{tmp_path / 'by-mlflow.db'}").search_experiments()  # MLflow's own
    assert _normalized(seeded) == _normalized(tmp_path / "by-mlflow.db")

    run = client.create_run("0")
    client.log_metric(run.info.run_id, "loss", 0.5)
    assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}


def test_an_existing_store_is_never_replaced(tmp_path, monkeypatch):
    import mlflow

    from trainpipe.services import tracking

    monkeypatch.setenv(tracking.STORE_CACHE_ENV, str(tmp_path / "cache"))
    store = tmp_path / "mlflow.db"
    uri = f"sqlite:///{store}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("kept", artifact_location=(tmp_path / "art").as_uri())
    tracking.seed_sqlite_store(uri)
    tracking.connect(uri)
    assert tracking.connect(uri).get_experiment(exp).name == "kept"
    assert not list(tmp_path.glob(".mlflow.db.*")), "no seed copy left beside the store"
