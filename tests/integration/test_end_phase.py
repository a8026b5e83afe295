"""A run's end writes the weights once: the last checkpoint's weights file is the model's, and the model's is
the one in a local MLflow store, under other names (hard links), and the model is proven to load and predict
without a second pass over them. Issue 56; the time it takes is bench/families/end_phase.py's row.

Small models on the digits, a SQLite tracking store with its artifacts on this file system."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, result_of, run_component

pytestmark = pytest.mark.integration

TEAM = {"PYTHONPATH": str(REPO / "tests" / "fixtures")}


def train(data: Path, out: Path, *extra: str, env: dict | None = None):
    return run_component(
        "train_model",
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--tracking-uri",
        f"sqlite:///{out.parent / 'mlflow.db'}",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--checkpoint-every-steps",
        "10",
        *extra,
        env=env,
    )


def last_checkpoint(out: Path) -> Path:
    return sorted(p for p in (out / "checkpoints").iterdir() if p.name.startswith("ckpt-"))[-1]


def logged_weights(root: Path) -> list[Path]:
    return list((root / "mlartifacts").rglob("model.safetensors"))


def weights(path: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(path))


@pytest.fixture(scope="module")
def whole(tmp_path_factory, digits_csv):
    out = tmp_path_factory.mktemp("whole") / "m"
    return out, result_of(train(digits_csv, out))


def test_the_model_the_last_checkpoint_and_the_logged_model_are_one_file(whole):
    out, r = whole
    ckpt = last_checkpoint(out)
    assert ckpt.name == "ckpt-0000000044" and r["global_steps"] == 44
    (logged,) = logged_weights(out.parent)
    names = [out / "model.safetensors", ckpt / "model.safetensors", logged]
    assert len({(os.stat(p).st_dev, os.stat(p).st_ino) for p in names}) == 1  # one file, three names
    assert os.stat(names[0]).st_nlink == 3
    import hashlib

    assert r["model_sha256"] == hashlib.sha256(names[0].read_bytes()).hexdigest()
    from trainpipe.training.digest import weights_digest

    telemetry = json.loads((out / "telemetry" / "rank0.json").read_text())
    assert telemetry["weights_sha256"] == weights_digest(weights(names[0]))  # taken of the checkpoint's host copy


def test_the_logged_model_loads_in_mlflow_and_predicts_what_the_run_proved(whole):
    import mlflow
    import pandas as pd

    out, r = whole
    mlflow.set_tracking_uri(f"sqlite:///{out.parent / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(r["model_uri"])
    example = pd.read_json(out / "input_example.json", orient="split", dtype=False)
    expected = pd.read_json(out / "output_example.json", orient="split", dtype=False)
    got = model.predict(example)
    assert list(got["prediction"]) == list(expected["prediction"])
    assert (got.drop(columns="prediction") - expected.drop(columns="prediction")).abs().max().max() < 1e-6


def test_a_killed_run_resumes_from_the_weights_file_to_the_same_model(tmp_path, whole, digits_csv):
    proc = train(digits_csv, tmp_path / "m", "--max-restarts", "1", env={"TRAINPIPE_FAULT": "kill:0:25"})
    r = result_of(proc)
    assert "injected fault kill at step 25" in proc.stderr and r["resumed_from_step"] == 20
    assert r["model_sha256"] == whole[1]["model_sha256"]
    assert (tmp_path / "m" / "metrics.jsonl").read_text() == (whole[0] / "metrics.jsonl").read_text()


def test_a_rerun_of_a_finished_training_keeps_its_model(tmp_path, digits_csv):
    out = tmp_path / "m"
    first = result_of(train(digits_csv, out))
    again = result_of(train(digits_csv, out))
    assert again["resumed_from_step"] == 44 and again["model_sha256"] == first["model_sha256"]
    assert again["model_uri"] == first["model_uri"]


def test_a_model_changed_after_the_loop_is_written_as_it_was_saved(tmp_path, digits_csv):
    out = tmp_path / "m"
    r = result_of(train(digits_csv, out, "--train-function", "teampkg.after_loop:train", env=TEAM))
    ckpt = last_checkpoint(out) / "model.safetensors"
    assert os.stat(out / "model.safetensors").st_ino != os.stat(ckpt).st_ino
    saved, checkpointed = weights(out / "model.safetensors"), weights(ckpt)
    assert abs(saved["weight"] - 0.5 * checkpointed["weight"]).max() < 1e-7
    assert (saved["bias"] == checkpointed["bias"]).all()
    meta = json.loads((out / "model.json").read_text())
    assert meta["builder"] == "torch.nn.modules.linear:Linear" or meta["builder"].endswith(":Linear")
    assert r["model_sha256"] != ""
