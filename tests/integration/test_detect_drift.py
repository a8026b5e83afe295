"""detect_drift against the champion's own training data: found through the registered version's
lineage and fetched from its real DVC remote (the local cache removed first), on a real MLflow
server; bad references and bad data are one line with their documented exit code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import make_snapshot, result_of, run_component
from trainpipe.contract.artifacts import MARKER

pytestmark = pytest.mark.integration

NAME = "drift-digits"


@pytest.fixture(scope="module")
def champion(tmp_path_factory, digits_csv, mlflow_server):
    """digits → validate → snapshot (a local DVC remote) → train (one epoch) → evaluate → register
    as the champion of NAME; then the workspace's DVC cache is removed, so the reference can come
    only from the remote."""
    root = tmp_path_factory.mktemp("drift")
    make_snapshot(root, digits_csv, "label", dataset_name="digits")
    result_of(
        run_component(
            "train_model",
            "--data",
            str(root / "s"),
            "--output-dir",
            str(root / "m"),
            "--tracking-uri",
            mlflow_server,
            "--nproc-per-node",
            "1",
            "--epochs",
            "2",
            "--checkpoint-every-steps",
            "0",
        )
    )
    result_of(
        run_component(
            "evaluate_model",
            "--model",
            str(root / "m"),
            "--data",
            str(root / "s"),
            "--output-dir",
            str(root / "e"),
            "--thresholds",
            '{"accuracy": 0.3}',
            "--model-name",
            NAME,
            "--tracking-uri",
            mlflow_server,
        )
    )
    reg = result_of(
        run_component(
            "register_model",
            "--model",
            str(root / "m"),
            "--decision",
            str(root / "e"),
            "--output-dir",
            str(root / "r"),
            "--model-name",
            NAME,
            "--tracking-uri",
            mlflow_server,
        )
    )
    assert reg["version"] == "1"
    shutil.rmtree(root / "repo" / ".dvc" / "cache")
    frame = pd.read_csv(digits_csv)
    order = np.random.default_rng(5).permutation(len(frame))
    frame.iloc[order[:1000]].to_csv(root / "resample.csv", index=False)
    moved = frame.iloc[order[:1000]].copy()
    moved["pixel_2_3"] = moved["pixel_2_3"] + 4
    moved["pixel_3_4"] = moved["pixel_3_4"] * 1.8
    moved.to_csv(root / "moved.csv", index=False)
    frame[frame["label"] < 3].to_csv(root / "three-classes.csv", index=False)
    return root


def _drift(root: Path, data: str, out: str, server: str, *extra: str, env: dict | None = None):
    return run_component(
        "detect_drift",
        "--data",
        str(root / data),
        "--output-dir",
        str(root / out),
        "--model-name",
        NAME,
        "--tracking-uri",
        server,
        *extra,
        env=env,
        cwd=root,
    )


def test_an_unchanged_resample_does_not_retrain_and_the_reference_came_through_the_lineage(champion, mlflow_server):
    """Slow when it runs first (about a minute in setup): the module's champion fixture validates, snapshots,
    trains, evaluates and registers a real model once for every test here."""
    r = result_of(_drift(champion, "resample.csv", "d-same", mlflow_server))
    snap = json.loads((champion / "s" / "trainpipe.json").read_text())["lineage"]["snapshot"]
    ref = r["reference"]
    assert (
        ref["source"] == "lineage"
        and ref["model_version"] == "1"
        and ref["snapshot"]["md5"] == snap["md5"]
        and ref["rows"] == 1797
    )
    assert r["retrain"] is False and r["dataset_drift"] is False and r["drifted_columns"] == []
    assert r["reasons"][0].startswith("no drift: 0 of 65 columns")
    assert r["prediction"]["column"] == "prediction" and r["prediction"]["drifted"] is False
    assert r["lineage"]["drift"]["reference_md5"] == snap["md5"] and r["lineage"]["drift"]["retrain"] is False
    written = json.loads((champion / "d-same" / "drift.json").read_text())
    assert {c["column"] for c in written["columns"]} == {f"pixel_{i}_{j}" for i in range(8) for j in range(8)} | {
        "label"
    }


def test_moved_features_and_a_changed_label_balance_are_named_and_retrain(champion, mlflow_server):
    audit = champion / "audit.jsonl"
    r = result_of(
        _drift(
            champion,
            "moved.csv",
            "d-moved",
            mlflow_server,
            "--drift-share",
            "0.02",
            env={"TRAINPIPE_AUDIT_LOG": str(audit)},
        )
    )
    assert r["drifted_columns"] == ["pixel_2_3", "pixel_3_4"] and r["retrain"] is True
    assert r["reasons"][0].startswith("data drifted: 2 of 65 columns (pixel_2_3, pixel_3_4)")
    # the decision is in the audit log, beside the execution
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    check = [x for x in records if x["action"] == "drift_check"]
    assert len(check) == 1 and check[0]["component"] == "detect_drift" and check[0]["decision"]["retrain"] is True
    assert (
        check[0]["decision"]["drifted_columns"] == ["pixel_2_3", "pixel_3_4"]
        and check[0]["decision"]["champion_version"] == "1"
    )
    three = result_of(
        _drift(champion, "three-classes.csv", "d-three", mlflow_server, "--prediction-drift-retrains", "true")
    )
    label = [c for c in three["columns"] if c["is_label"]][0]
    assert label["column"] == "label" and label["drifted"] and three["prediction"]["drifted"]
    assert three["retrain"] is True and any("the champion's predictions drifted" in x for x in three["reasons"])
    # the figures reached MLflow, with the report
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("trainpipe-drift")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    moved = runs[1]  # the newest is the three-classes run
    assert moved.data.metrics["share_drifted"] == pytest.approx(2 / 65)
    assert moved.data.metrics["drift.pixel_2_3"] >= 0.1  # 1,797 reference rows: the normed Wasserstein distance decides
    assert moved.data.tags["trainpipe.champion_version"] == "1"
    assert sorted(a.path for a in client.list_artifacts(moved.info.run_id, "drift")) == [
        "drift/drift.json",
        "drift/report.html",
    ]


def test_the_report_renders_in_headless_chromium_with_a_chart_per_drifted_column(champion):
    from tests.helpers.browser import render

    page = render(champion / "d-moved" / "report.html")
    assert page["errors"] == [] and page["title"] == "trainpipe drift"
    alts = [i["alt"] for i in page["images"]]
    assert (
        sorted(alts[:2]) == ["pixel_2_3", "pixel_3_4"] and len(alts) == 65
    )  # one a column, drifted first, then the most moved
    assert all(i["width"] > 100 and i["height"] > 100 for i in page["images"])
    assert "Drift: retrain" in page["text"] and "champion version 1" in page["text"]


def _one_line(proc, code: int, start: str) -> None:
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"trainpipe detect_drift: error: {start}"), proc.stderr[
        -500:
    ]


def test_a_remote_that_is_down_is_exit_75_and_bad_data_is_exit_2(champion, mlflow_server, tmp_path):
    remote, away = champion / "remote", champion / "remote-away"
    remote.rename(away)
    try:
        _one_line(_drift(champion, "resample.csv", "d-down", mlflow_server), 75, "reference: snapshot ")
    finally:
        away.rename(remote)
    assert not (champion / "d-down" / MARKER).exists() and not (champion / "d-down" / "drift.json").exists()
    frame = pd.read_csv(champion / "resample.csv")
    frame.drop(columns=["pixel_4_4"]).to_csv(tmp_path / "fewer.csv", index=False)
    _one_line(
        _drift(champion, str(tmp_path / "fewer.csv"), str(tmp_path / "o1"), mlflow_server),
        2,
        "current: has no column 'pixel_4_4'",
    )
    frame.head(0).to_csv(tmp_path / "empty.csv", index=False)
    _one_line(_drift(champion, str(tmp_path / "empty.csv"), str(tmp_path / "o2"), mlflow_server), 2, "data:")
    assert not (tmp_path / "o1" / MARKER).exists() and not (tmp_path / "o2" / MARKER).exists()  # nothing half-written


def test_a_champion_without_a_lineage_is_exit_2_and_no_champion_retrains(champion, mlflow_server, tmp_path):
    """A version registered by hand (plain MLflow, no trainpipe lineage) cannot name the data it was trained on."""
    from mlflow import MlflowClient

    name = "drift-by-hand"
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("trainpipe-drift")
    run = client.create_run(exp.experiment_id)
    (tmp_path / "note.txt").write_text("a model registered without trainpipe")
    client.log_artifact(run.info.run_id, str(tmp_path / "note.txt"), "model")
    client.create_registered_model(name)
    version = client.create_model_version(name, f"runs:/{run.info.run_id}/model", run.info.run_id)
    client.set_registered_model_alias(name, "champion", version.version)
    proc = run_component(
        "detect_drift",
        "--data",
        str(champion / "resample.csv"),
        "--output-dir",
        str(tmp_path / "d"),
        "--model-name",
        name,
        "--tracking-uri",
        mlflow_server,
    )
    _one_line(proc, 2, f"model_name: champion version 1 of '{name}' has no trainpipe lineage")
    # no champion at all: nothing to compare with, so the pipeline retrains
    first = result_of(
        run_component(
            "detect_drift",
            "--data",
            str(champion / "resample.csv"),
            "--output-dir",
            str(tmp_path / "n"),
            "--model-name",
            "never-registered",
            "--tracking-uri",
            mlflow_server,
        )
    )
    assert (
        first["retrain"] is True
        and first["reference"]["source"] == "none"
        and "no champion of 'never-registered'" in first["reasons"][0]
    )
    assert first["columns"] == [] and (tmp_path / "n" / "report.html").exists()
