"""The reference pipeline on a training set from a Feast feature store, on both engines: the config
names a feature service and a local feature repository, its data is the entity table, and the
registered version's lineage says which features, as of when."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.helpers.feast_repo import make_feature_repo
from tests.helpers.pipeline import run_pipeline
from trainpipe.contract.io import file_digest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def digits_store(tmp_path_factory, digits_csv):
    """The digits as a feature view keyed by image_id: each image's pixels as of 2026-01-01, and a later
    update (2027) of every pixel to 99 that no training row may see; the entity table holds image_id, a
    moment in March 2026 and the label."""
    import pandas as pd

    digits = pd.read_csv(digits_csv)
    pixels = digits.drop(columns="label").astype("float64")
    ids = pd.Series(range(len(digits)), name="image_id")
    then = pd.Timestamp("2026-01-01", tz="UTC")
    history = pd.concat(
        [
            pixels.assign(image_id=ids, event_timestamp=then),
            (pixels * 0 + 99.0).assign(image_id=ids, event_timestamp=pd.Timestamp("2027-01-01", tz="UTC")),
        ],
        ignore_index=True,
    )
    root = tmp_path_factory.mktemp("store")
    repo = make_feature_repo(root / "repo", {"pixels": history}, key="image_id", service="digits_training")
    entity = pd.DataFrame(
        {
            "image_id": ids,
            "event_timestamp": [pd.Timestamp("2026-03-01", tz="UTC") + pd.Timedelta(minutes=i) for i in ids],
            "label": digits["label"],
        }
    )
    entity.to_csv(root / "entities.csv", index=False)
    return repo, root / "entities.csv"


@pytest.mark.parametrize("engine", ["kfp-local", "airflow-local"])
def test_a_feature_service_trains_registers_and_its_lineage_names_the_features(
    tmp_path, digits_store, mlflow_server, engine
):
    """Slow on purpose (about a minute per engine): the whole reference pipeline, from an entity table and
    a feature repository to a registered version, on each engine."""
    import mlflow
    import pandas as pd

    repo, entities = digits_store
    model = f"feast-{engine.split('-')[0]}"
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": str(entities),
                "features": "digits_training",
                "feature_repo": str(repo),
                "workspace": str(tmp_path / "ws"),
                "dataset_name": "digits-features",
                "model_name": model,
                "tracking_uri": mlflow_server,
                "thresholds": {"accuracy": 0.85},
                "train": {"nproc_per_node": 1, "epochs": 4, "batch_size": 64},
            }
        )
    )
    proc = run_pipeline(config, engine, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"registered model : {model} version 1 alias @champion (new)" in proc.stdout, proc.stdout
    validated = next((tmp_path / "ws").rglob("training_set.parquet"))
    pixels = pd.read_parquet(validated).drop(columns="label")
    assert pixels.shape == (1797, 64) and (pixels.to_numpy() <= 16).all(), "a 2027 value reached a 2026 row"

    tags = mlflow.MlflowClient(mlflow_server).get_model_version_by_alias(model, "champion").tags
    assert tags["lineage.features.service"] == "digits_training"
    assert len(tags["lineage.features.views.pixels.fingerprint"]) == 64
    assert tags["lineage.features.as_of_max"].startswith("2026-03-02")
    # the snapshot versions the joined set; the raw data is the entity table, its own bytes
    assert tags["lineage.snapshot.md5"] == file_digest(validated)
    assert tags["lineage.source.md5"] == tags["lineage.features.entity_md5"] == file_digest(entities)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    lineage = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "lineage", f"models:/{model}@champion"],
        cwd=config.parent,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert lineage.returncode == 0, lineage.stderr[-2000:]
    assert "  features   Feast project shop service digits_training at " in lineage.stdout, lineage.stdout
    assert "    view     pixels: pixel_0_0, pixel_0_1," in lineage.stdout and "verify     OK" in lineage.stdout
    raw = next(line for line in lineage.stdout.splitlines() if line.startswith("  raw data"))
    assert raw.endswith(f"entities.csv md5 {file_digest(entities)}"), raw
    assert "\n  cost       training " in lineage.stdout, lineage.stdout
