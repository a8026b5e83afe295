"""Each component's entrypoint on the real thing: GX, DVC with a local remote,
torchrun with 2 gloo ranks, an MLflow tracking server process."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import result_of, run_component
from trainpipe.contract.artifacts import MARKER

pytestmark = pytest.mark.integration


def test_validate_data_passes_and_writes_data_docs(tmp_path, tiny_csv):
    out = tmp_path / "v"  # given relative to the working directory, as a user at a shell would
    r = result_of(
        run_component(
            "validate_data", "--data", str(tiny_csv), "--output-dir", "v", "--label-column", "target", cwd=tmp_path
        )
    )
    # the default suite is train_model's preconditions: the label exists, is present and has two classes,
    # every feature column (four) is numeric, present and finite in float32, and there are rows enough
    assert r["success"] and r["evaluated"] == 2 + 3 * 4 + 2 and r["rows"] == 240
    assert (out / r["docs_index"]).is_file() and (out / r["docs_page"]).is_file()
    assert (out / "tiny.csv").read_bytes() == tiny_csv.read_bytes()
    assert json.loads((out / MARKER).read_text())["lineage"]["source"]["md5"] == r["data_md5"]


def test_validate_data_failure_is_exit_3_naming_expectations(tmp_path, tiny_csv):
    import pandas as pd

    bad = tmp_path / "bad.csv"
    df = pd.read_csv(tiny_csv)
    df.loc[3, "target"] = None
    df.to_csv(bad, index=False)
    out = tmp_path / "v"
    proc = run_component("validate_data", "--data", str(bad), "--output-dir", str(out), "--label-column", "target")
    assert proc.returncode == 3
    line = proc.stderr.strip().splitlines()[-1]
    assert (
        "failed 1 of 16 expectations" in line
        and "expect_column_values_to_not_be_null(column=target): label_column: 'target' has 1 missing values (first at "
        "row 3)"
        in line
    )
    assert not (out / MARKER).exists() and not (out / "bad.csv").exists()
    assert (out / "validation.json").is_file() and (out / "data_docs" / "index.html").is_file()


def test_custom_suite_file(tmp_path, tiny_csv):
    suite = tmp_path / "suite.json"
    suite.write_text(
        json.dumps(
            {
                "name": "mine",
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "f1", "min_value": 100}}
                ],
            }
        )
    )
    proc = run_component(
        "validate_data",
        "--data",
        str(tiny_csv),
        "--output-dir",
        str(tmp_path / "v"),
        "--label-column",
        "target",
        "--suite",
        str(suite),
    )
    assert proc.returncode == 3 and "suite 'mine' failed" in proc.stderr


@pytest.fixture(scope="module")
def validated(tmp_path_factory, tiny_csv):
    out = tmp_path_factory.mktemp("validated") / "v"
    result_of(
        run_component("validate_data", "--data", str(tiny_csv), "--output-dir", str(out), "--label-column", "target")
    )
    return out


def test_snapshot_same_bytes_same_hash_and_rerun_pushes_nothing(tmp_path, validated):
    from trainpipe.contract.io import file_digest

    args = [
        "--data",
        str(validated),
        "--repo-dir",
        str(tmp_path / "repo"),
        "--remote-url",
        str(tmp_path / "remote"),
        "--dataset-name",
        "tiny",
    ]
    first = result_of(run_component("snapshot_dataset", *args, "--output-dir", str(tmp_path / "s1")))
    second = result_of(run_component("snapshot_dataset", *args, "--output-dir", str(tmp_path / "s2")))
    assert first["md5"] == second["md5"] == file_digest(validated / "tiny.csv")
    assert first["pushed"] == 1 and first["committed"]
    assert second["pushed"] == 0 and not second["committed"] and second["rev"] == first["rev"]
    stored = tmp_path / "remote" / "files" / "md5" / first["md5"][:2] / first["md5"][2:]
    assert stored.read_bytes() == (validated / "tiny.csv").read_bytes()
    assert json.loads((tmp_path / "s2" / MARKER).read_text())["lineage"]["snapshot"]["rev"] == first["rev"]


def test_a_new_months_file_is_the_next_version_of_its_dataset(tmp_path, tiny_csv):
    """``bc-2026-11.csv`` after ``bc-2026-10.csv`` under one dataset_name: the next version of the
    dataset (a new commit that replaces the previous file's record), not a refusal; the previous
    version stays fetchable at its revision, as detect_drift fetches a champion's snapshot."""
    import subprocess

    import pandas as pd
    from dvc.api import DVCFileSystem

    months = {}
    for month, rows in (("2026-10", 40), ("2026-11", 60)):
        raw = tmp_path / f"bc-{month}.csv"
        pd.read_csv(tiny_csv).head(rows).to_csv(raw, index=False)
        v = tmp_path / f"v-{month}"
        args = ["--data", str(raw), "--output-dir", str(v), "--label-column", "target", "--batch-size", "8"]
        result_of(run_component("validate_data", *args))
        snap = ["--data", str(v), "--output-dir", str(tmp_path / f"s-{month}"), "--dataset-name", "bc"]
        snap += ["--repo-dir", str(tmp_path / "repo"), "--remote-url", str(tmp_path / "remote")]
        proc = run_component("snapshot_dataset", *snap)
        months[month] = (result_of(proc), proc.stderr)
    (first, _), (second, said) = months["2026-10"], months["2026-11"]
    assert second["committed"] and second["md5"] != first["md5"] and second["path"] == "data/bc/bc-2026-11.csv"
    assert "bc-2026-11.csv is the next version of dataset 'bc' (was bc-2026-10.csv)" in said
    tracked = subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "ls-files", "data/bc"], capture_output=True, text=True
    )
    assert tracked.stdout.split() == ["data/bc/.gitignore", "data/bc/bc-2026-11.csv.dvc"]
    fs = DVCFileSystem(str(tmp_path / "repo"), rev=first["rev"])  # the previous version, at its revision
    with fs.open(first["path"]) as fh:
        assert len(pd.read_csv(fh)) == 40


def test_snapshot_refuses_an_unfinished_input(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "x.csv").write_text("a\n1\n")
    proc = run_component(
        "snapshot_dataset",
        "--data",
        str(tmp_path / "half"),
        "--output-dir",
        str(tmp_path / "o"),
        "--repo-dir",
        str(tmp_path / "r"),
        "--remote-url",
        str(tmp_path / "rem"),
    )
    assert proc.returncode == 2 and "not a completed trainpipe artifact" in proc.stderr


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, validated):
    root = tmp_path_factory.mktemp("snap")
    result_of(
        run_component(
            "snapshot_dataset",
            "--data",
            str(validated),
            "--output-dir",
            str(root / "s"),
            "--repo-dir",
            str(root / "repo"),
            "--remote-url",
            str(root / "remote"),
        )
    )
    return root / "s"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, snapshot, mlflow_server):
    out = tmp_path_factory.mktemp("train") / "m"
    r = result_of(
        run_component(
            "train_model",
            "--data",
            str(snapshot),
            "--output-dir",
            str(out),
            "--label-column",
            "target",
            "--nproc-per-node",
            "2",
            "--epochs",
            "3",
            "--batch-size",
            "32",
            "--tracking-uri",
            mlflow_server,
        )
    )
    return out, r


def test_train_model_with_two_gloo_ranks_logs_to_mlflow(trained, mlflow_server):
    import mlflow

    out, r = trained
    assert r["world_size"] == 2 and r["dist_backend"] == "gloo" and r["device"] == "cpu"
    assert sorted(p.name for p in (out / "telemetry").iterdir()) == ["rank0.json", "rank1.json"]
    assert (out / "model.safetensors").is_file() and list((out / "checkpoints").glob("ckpt-*"))
    run = mlflow.MlflowClient(mlflow_server).get_run(r["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["nproc_per_node"] == "2"
    assert [
        m.step for m in mlflow.MlflowClient(mlflow_server).get_metric_history(r["mlflow_run_id"], "train_loss")
    ] == [0, 1, 2]


def test_the_last_checkpoint_holds_the_trained_model_and_reads_without_running_code(trained):
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from trainpipe.data.tabular import split_indices
    from trainpipe.services.serving import loader
    from trainpipe.training.safe_dcp import SafeLoadPlanner, SafeReader

    out, _ = trained
    newest = sorted(p for p in (out / "checkpoints").iterdir() if p.is_dir() and p.name.startswith("ckpt-"))[-1]
    train_rows = len(split_indices(240, 0.2, 0)[0])
    trainer = json.loads((newest / "trainer.json").read_text())
    assert trainer["global_step"] == 3 * (train_rows // 32) and [h["epoch"] for h in trainer["history"]] == [0, 1, 2]
    model = loader.load(out).module
    # the weights are a safetensors file of the checkpoint's, the model's own under a second name (issue 56)
    weights = load_file(str(newest / "model.safetensors"))
    assert os.stat(newest / "model.safetensors").st_ino == os.stat(out / "model.safetensors").st_ino
    model.load_state_dict(weights, strict=True)
    # the optimizer's state reads from the DCP files without running code; the weights are not in them
    stored = SafeReader(str(newest)).read_metadata().state_dict_metadata
    assert not [k for k in stored if k.startswith("model.")]
    momentum = {k: torch.zeros(v.size) for k, v in stored.items() if k.endswith(".momentum_buffer")}
    dcp.load(momentum, storage_reader=SafeReader(str(newest)), planner=SafeLoadPlanner(), no_dist=True)
    assert any(t.abs().sum() > 0 for t in momentum.values())


def test_train_model_bad_label_is_one_line_exit_2(tmp_path, snapshot, mlflow_server):
    proc = run_component(
        "train_model",
        "--data",
        str(snapshot),
        "--output-dir",
        str(tmp_path / "m"),
        "--label-column",
        "nope",
        "--tracking-uri",
        mlflow_server,
    )
    assert proc.returncode == 2 and "label_column: 'nope' is not a column" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "m" / MARKER).exists()


def test_profile_evaluate_register_and_idempotency(tmp_path, trained, snapshot, mlflow_server):
    import mlflow
    import numpy as np

    model_dir, train_result = trained
    prof = result_of(run_component("profile_training", "--model", str(model_dir), "--output-dir", str(tmp_path / "p")))
    assert prof["world_size"] == 2 and prof["samples_per_second"] > 0
    assert (tmp_path / "p" / "report.html").read_text().count("data:image/png;base64") == 3
    ev = result_of(
        run_component(
            "evaluate_model",
            "--model",
            str(model_dir),
            "--data",
            str(snapshot),
            "--output-dir",
            str(tmp_path / "e"),
            "--label-column",
            "target",
            "--thresholds",
            '{"accuracy": 0.6}',
        )
    )
    from trainpipe.data.tabular import split_indices

    assert (
        ev["n_test"] == len(split_indices(240, 0.2, 0)[1])
        and ev["decision"]["passed"]
        and ev["metrics"]["accuracy"] >= 0.6
    )
    args = [
        "--model",
        str(model_dir),
        "--decision",
        str(tmp_path / "e"),
        "--training-profile",
        str(tmp_path / "p"),
        "--tracking-uri",
        mlflow_server,
        "--model-name",
        "tiny",
    ]
    first = result_of(run_component("register_model", *args, "--output-dir", str(tmp_path / "r1")))
    second = result_of(run_component("register_model", *args, "--output-dir", str(tmp_path / "r2")))
    assert first["created"] and not second["created"] and first["version"] == second["version"]
    client = mlflow.MlflowClient(mlflow_server)
    assert len(client.search_model_versions("name = 'tiny'")) == 1
    mv = client.get_model_version_by_alias("tiny", "champion")
    assert mv.version == first["version"]
    assert mv.tags["lineage.snapshot.md5"] == json.loads((snapshot / MARKER).read_text())["result"]["md5"]
    assert mv.tags["lineage.training.mlflow_run_id"] == train_result["mlflow_run_id"]
    assert mv.tags["lineage.validation.success"] == "True"
    assert mv.tags["lineage.orchestrator.name"] == "manual"
    # the registered version is the MLflow pyfunc train_model logged: raw feature columns in, predictions out
    import pandas as pd

    from trainpipe.services.serving import loader

    mlflow.set_tracking_uri(mlflow_server)
    served = mlflow.pyfunc.load_model("models:/tiny@champion")
    rows = pd.DataFrame(np.random.default_rng(1).normal(size=(5, 4)), columns=["f1", "f2", "f3", "f4"])
    expected = loader.load(model_dir).predict_frame(rows)
    got = served.predict(rows)
    assert list(got["prediction"]) == list(expected["prediction"])
    np.testing.assert_allclose(got["probability_yes"].to_numpy(), expected["probability_yes"].to_numpy(), rtol=1e-6)


def test_gate_not_passed_registers_nothing(tmp_path, trained, snapshot, mlflow_server):
    model_dir, _ = trained
    ev = result_of(
        run_component(
            "evaluate_model",
            "--model",
            str(model_dir),
            "--data",
            str(snapshot),
            "--output-dir",
            str(tmp_path / "e"),
            "--label-column",
            "target",
            "--thresholds",
            '{"accuracy": 0.999}',
        )
    )
    assert not ev["decision"]["passed"]
    proc = run_component(
        "evaluate_model",
        "--model",
        str(model_dir),
        "--data",
        str(snapshot),
        "--output-dir",
        str(tmp_path / "e2"),
        "--label-column",
        "target",
        "--thresholds",
        '{"accuracy": 0.999}',
        "--fail-on-gate",
        "true",
    )
    assert proc.returncode == 4 and "gate not passed" in proc.stderr
    r = result_of(
        run_component(
            "register_model",
            "--model",
            str(model_dir),
            "--decision",
            str(tmp_path / "e"),
            "--output-dir",
            str(tmp_path / "r"),
            "--tracking-uri",
            mlflow_server,
            "--model-name",
            "never",
        )
    )
    assert not r["registered"]
    import mlflow

    assert mlflow.MlflowClient(mlflow_server).search_model_versions("name = 'never'") == []


def test_mlflow_down_is_transient_exit_75(tmp_path, trained):
    model_dir, _ = trained
    proc = run_component(
        "train_model",
        "--data",
        str(model_dir.parent),
        "--output-dir",
        str(tmp_path / "m"),
        "--tracking-uri",
        "http://127.0.0.1:9",
        env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"},
    )
    # the input is checked first: a directory without one dataset file is bad input
    assert proc.returncode == 2
    snap_like = tmp_path / "snap"
    snap_like.mkdir()
    (snap_like / "d.csv").write_text("a,label\n1,0\n2,1\n3,0\n4,1\n5,0\n")
    proc = run_component(
        "train_model",
        "--data",
        str(snap_like / "d.csv"),
        "--output-dir",
        str(tmp_path / "m2"),
        "--tracking-uri",
        "http://127.0.0.1:9",
        "--nproc-per-node",
        "1",
        "--batch-size",
        "2",
        env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"},
    )
    assert proc.returncode == 75, proc.stderr[-2000:]
    assert "unavailable" in proc.stderr.strip().splitlines()[-1]
