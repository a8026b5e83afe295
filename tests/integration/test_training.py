"""train_model at production grade, on CPU with real launchers: torchrun (gloo),
horovodrun (gloo) and TensorFlow MultiWorkerMirroredStrategy on 127.0.0.1.

The digits (1797 rows, 1437 for training) with a global batch of 64 give 22 steps
per epoch; two epochs are 44 steps. Every run logs to the real MLflow server.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.conftest import REPO, result_of, run_component

pytestmark = pytest.mark.integration

STEPS = 44  # 2 epochs x 22 steps
INTERVAL = 10


def train(data: Path, out: Path, server: str, *extra: str, env: dict | None = None):
    return run_component(
        "train_model", "--data", str(data), "--output-dir", str(out), "--tracking-uri", server,
        "--epochs", "2", "--batch-size", "64", "--checkpoint-every-steps", str(INTERVAL), *extra, env=env,
    )


def weights(out: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(out / "model.safetensors"))


def max_diff(a: dict, b: dict) -> float:
    import numpy as np

    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def telemetry(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "telemetry").glob("rank*.json"))]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, digits_csv, mlflow_server):
    """An uninterrupted 2-rank gloo DDP run: the reference every other run is held to."""
    out = tmp_path_factory.mktemp("base") / "m"
    return out, result_of(train(digits_csv, out, mlflow_server))


def test_two_rank_ddp_matches_one_process_with_the_same_global_batch(tmp_path, baseline, digits_csv, mlflow_server):
    out, r = baseline
    assert r["world_size"] == 2 and r["dist_backend"] == "gloo" and r["global_steps"] == STEPS
    one = result_of(train(digits_csv, tmp_path / "one", mlflow_server, "--nproc-per-node", "1"))
    assert one["world_size"] == 1
    assert max_diff(weights(out), weights(tmp_path / "one")) <= 1e-5
    digests = {t["weights_sha256"] for t in telemetry(out)}
    assert len(digests) == 1, "DDP ranks ended with different weights"


@pytest.mark.parametrize("trial", [0, 1, 2])
def test_rank_killed_mid_epoch_resumes_and_matches_an_uninterrupted_run(tmp_path, trial, baseline, digits_csv, mlflow_server):
    rng = random.Random(1000 + trial)
    kill_step = rng.randrange(INTERVAL + 1, STEPS - 1)
    if kill_step % 22 == 0:
        kill_step += 1  # mid-epoch, not on an epoch boundary
    rank = rng.randrange(2)
    out = tmp_path / "m"
    proc = train(digits_csv, out, mlflow_server, "--max-restarts", "2", env={"TRAINPIPE_FAULT": f"kill:{rank}:{kill_step}"})
    r = result_of(proc)
    assert f"injected fault kill at step {kill_step}" in proc.stderr
    # resumed from the newest checkpoint at or before the kill: at most one interval lost
    assert kill_step - INTERVAL <= r["resumed_from_step"] <= kill_step
    assert r["global_steps"] == STEPS
    assert max_diff(weights(out), weights(baseline[0])) <= 1e-6
    assert (out / "metrics.jsonl").read_text() == (baseline[0] / "metrics.jsonl").read_text()


def test_kill_during_checkpoint_write_leaves_the_previous_checkpoint_loadable(tmp_path, baseline, digits_csv, mlflow_server):
    import torch

    out = tmp_path / "m"
    proc = train(digits_csv, out, mlflow_server, "--max-restarts", "0", env={"TRAINPIPE_FAULT": "kill_checkpoint:30"})
    assert proc.returncode != 0 and "injected fault kill_checkpoint at step 30" in proc.stderr
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("ckpt-*.pt")) == ["ckpt-0000000020.pt", "ckpt-0000000022.pt"]
    assert list(ckpts.glob(".ckpt-0000000030.pt.*.tmp")), "the torn write should be a hidden temp file"
    state = torch.load(ckpts / "ckpt-0000000022.pt", weights_only=True)
    assert state["global_step"] == 22
    # the rerun (a retried task) resumes from it and ends where an uninterrupted run ends
    r = result_of(train(digits_csv, out, mlflow_server))
    assert r["resumed_from_step"] == 22
    assert max_diff(weights(out), weights(baseline[0])) <= 1e-6
    assert not list(ckpts.glob(".ckpt-*.tmp"))


def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(tmp_path, baseline, digits_csv, mlflow_server):
    out = tmp_path / "m"
    result_of(train(digits_csv, out, mlflow_server, "--max-steps", "30"))
    newest = sorted((out / "checkpoints").glob("ckpt-*.pt"))[-1]
    assert newest.name == "ckpt-0000000030.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # torn by a disk that lied about fsync
    proc = train(digits_csv, out, mlflow_server)
    r = result_of(proc)
    assert "warning: skipping unreadable checkpoint ckpt-0000000030.pt" in proc.stderr
    assert r["resumed_from_step"] == 22 and r["global_steps"] == STEPS
    assert max_diff(weights(out), weights(baseline[0])) <= 1e-6


def test_bf16_on_cpu_stays_within_tolerance_of_fp32(tmp_path, baseline, digits_csv, mlflow_server):
    r = result_of(train(digits_csv, tmp_path / "bf16", mlflow_server, "--precision", "bf16"))
    fp32 = baseline[1]
    assert r["precision"] == "bf16"
    # stated tolerance (README): final training loss within 0.05 and accuracy within 0.02 of fp32
    assert abs(r["final_loss"] - fp32["final_loss"]) <= 0.05
    assert abs(r["train_accuracy"] - fp32["train_accuracy"]) <= 0.02


def test_horovod_two_ranks_agree_and_match_ddp(tmp_path, baseline, digits_csv, mlflow_server):
    out = tmp_path / "hvd"
    r = result_of(train(digits_csv, out, mlflow_server, "--backend", "horovod"))
    assert r["backend"] == "horovod" and r["dist_backend"] == "horovod-gloo" and r["world_size"] == 2
    ranks = telemetry(out)
    assert [t["rank"] for t in ranks] == [0, 1] and len({t["weights_sha256"] for t in ranks}) == 1
    assert max_diff(weights(out), weights(baseline[0])) <= 1e-5


def test_tensorflow_two_workers_train_and_end_with_identical_weights(tmp_path, digits_csv, mlflow_server):
    import pandas as pd

    from trainpipe.components.train_model.models import load_model, predict_proba

    out = tmp_path / "tf"
    r = result_of(train(digits_csv, out, mlflow_server, "--backend", "tensorflow", "--model", "cnn", "--epochs", "3", "--profile-steps", "5"))
    assert r["backend"] == "tensorflow" and r["dist_backend"] == "MultiWorkerMirroredStrategy" and r["world_size"] == 2
    ranks = telemetry(out)
    assert [t["rank"] for t in ranks] == [0, 1] and len({t["weights_sha256"] for t in ranks}) == 1
    assert r["train_accuracy"] > 0.85
    # the chief traced steps 4..8 with the TF profiler (TensorBoard's profile plugin reads it)
    assert list((out / "telemetry" / "tf_profile").rglob("*.xplane.pb"))
    assert ranks[0]["profiler"]["tensorboard_logdir"] == "tf_profile" and ranks[1]["profiler"] is None
    # the TF weights are written in the torch layout: the torch CNN predicts as well as training reported
    model, meta = load_model(out)
    df = pd.read_csv(digits_csv)
    acc = (predict_proba(model, meta, df[meta["feature_columns"]].to_numpy()).argmax(1) == df["label"].to_numpy()).mean()
    assert acc > 0.85


def test_cnn_and_a_user_model_entry_point(tmp_path, digits_csv, mlflow_server, monkeypatch):
    from trainpipe.components.train_model.models import load_model

    cnn = result_of(train(digits_csv, tmp_path / "cnn", mlflow_server, "--model", "cnn", "--epochs", "3"))
    assert cnn["model_arch"] == "cnn" and cnn["train_accuracy"] > 0.85
    assert json.loads((tmp_path / "cnn" / "model.json").read_text())["input_shape"] == [1, 8, 8]
    env = {"PYTHONPATH": str(REPO)}
    own = result_of(
        train(digits_csv, tmp_path / "own", mlflow_server, "--model", "tests.fixtures.custom_models:tiny_net",
              "--model-kwargs", '{"width": 24}', "--nproc-per-node", "1", env=env)
    )
    assert own["model_arch"] == "tests.fixtures.custom_models:tiny_net"
    from trainpipe.contract.errors import InputError

    with pytest.raises(InputError, match="not trusted here"):  # an artifact names code: only trusted code runs
        load_model(tmp_path / "own")
    monkeypatch.setenv("TRAINPIPE_TRUSTED_MODEL_CODE", "tests.fixtures")
    model, _ = load_model(tmp_path / "own")
    assert model[0].out_features == 24


def _one_line_exit_2(proc, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in last, last
    return last


def _nothing_written(out: Path) -> None:
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*")), list(out.rglob("*"))


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--backend", "jax"], ["backend", "torch_ddp"]),
        (["--nproc-per-node", "0"], ["nproc_per_node", "greater than or equal to 1"]),
        (["--precision", "fp16", "--device", "cpu"], ["precision: fp16 needs a CUDA device"]),
        (["--device", "cuda"], ["device: cuda requested but no CUDA device is visible"]),
        (["--label-column", "nope"], ["label_column: 'nope' is not a column"]),
        (["--batch-size", "63"], ["batch_size: 63 must be divisible by the world size 2"]),
        (["--model", "no_colon"], ["model: 'no_colon' is neither mlp, cnn nor 'package.module:function'"]),
        (["--model", "tests.fixtures.custom_models:not_a_module"], ["returned str, not a torch.nn.Module"]),
        (["--backend", "horovod", "--horovod-binding", "tensorflow"], ["horovod_binding", "do not build against TensorFlow 2.21"]),
    ],
)
def test_bad_config_is_one_line_exit_2_and_writes_nothing(tmp_path, digits_csv, mlflow_server, args, needles):
    out = tmp_path / "m"
    proc = train(digits_csv, out, mlflow_server, *args, env={"PYTHONPATH": str(REPO)})
    _one_line_exit_2(proc, *needles)
    _nothing_written(out)


def test_more_gpu_ranks_than_gpus_is_refused(tmp_path, digits_csv, mlflow_server):
    # No GPU here: a stand-in nvidia-smi reports one, as a one-GPU node would.
    import os

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    out = tmp_path / "m"
    proc = train(digits_csv, out, mlflow_server, "--device", "cuda", "--nproc-per-node", "2",
                 env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    _one_line_exit_2(proc, "nproc_per_node: 2 GPU ranks requested but only 1 GPUs are visible")
    _nothing_written(out)
