"""train_model on CUDA: NCCL, bf16 and fp16, rows on the device and rows copied ahead from pinned
memory, FSDP2 and DDP resumed after a killed rank, a checkpoint the loop does not wait for, and
SIGTERM to exit 75 to an exact resume. Skipped where no CUDA device is visible (this project's CI
has none); run them on a GPU machine with ``pytest -m cuda`` (``../shared/gpu/README.md`` carries
trainpipe there). The data is a raw CSV and tracking a SQLite file: a GPU machine needs neither DVC
nor Great Expectations. Up to two GPUs are used, one rank each."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, result_of, run_component


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


GPUS = _gpus()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(GPUS == 0, reason="no CUDA device is visible")]
NPROC = str(min(2, GPUS))
TEAM = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "fixtures"), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """digits ×8 (14,376 rows): enough steps per epoch for mid-epoch faults at a GPU's batch sizes."""
    import pandas as pd

    from trainpipe.demo import write_digits

    path = write_digits(tmp_path_factory.mktemp("raw") / "digits.csv")
    pd.concat([pd.read_csv(path)] * 8, ignore_index=True).to_csv(path, index=False)
    return path


def train(data: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_component(
        "train_model",
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--tracking-uri",
        f"sqlite:///{out.parent / 'mlflow.db'}",
        "--device",
        "cuda",
        "--nproc-per-node",
        NPROC,
        "--epochs",
        "2",
        "--batch-size",
        "256",
        "--train-config",
        '{"hidden_units": [512, 512]}',
        *extra,
        env=env,
    )


def telemetry(out: Path) -> dict:
    return json.loads((out / "telemetry" / "rank0.json").read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def weights(out: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(out / "model.safetensors"))


def max_diff(a: dict, b: dict) -> float:
    import numpy as np

    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.fixture(scope="module")
def fp32(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("fp32") / "m"
    return out, result_of(train(data, out, "--checkpoint-every-steps", "20"))


def test_nccl_trains_on_the_gpu_with_the_rows_resident_there(fp32):
    out, r = fp32
    assert r["device"] == "cuda" and r["dist_backend"] == "nccl" and r["metrics"]["accuracy"] > 0.9
    t = telemetry(out)
    assert t["rows_on"] == "device" and t["device"].startswith("cuda")
    assert all(s["step_s"] > 0 for s in t["steps"])  # read from CUDA events, none missing


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_stays_within_tolerance_of_fp32(tmp_path, data, fp32, precision):
    r = result_of(train(data, tmp_path / "m", "--precision", precision))
    assert r["precision"] == precision
    assert abs(r["final_loss"] - fp32[1]["final_loss"]) <= 0.05
    assert abs(r["metrics"]["accuracy"] - fp32[1]["metrics"]["accuracy"]) <= 0.02


def test_rows_copied_ahead_from_pinned_memory_train_as_rows_on_the_device(tmp_path, data, fp32):
    r = result_of(train(data, tmp_path / "m", "--checkpoint-every-steps", "20", "--device-data-share", "0"))
    assert telemetry(tmp_path / "m")["rows_on"] == "pinned" and r["global_steps"] == fp32[1]["global_steps"]
    assert max_diff(weights(tmp_path / "m"), weights(fp32[0])) <= 1e-5  # the same batches in the same order


def test_a_killed_rank_resumes_to_the_same_weights(tmp_path, data, fp32):
    proc = train(
        data,
        tmp_path / "m",
        "--checkpoint-every-steps",
        "20",
        "--max-restarts",
        "1",
        env={"TRAINPIPE_FAULT": "kill:0:50"},
    )
    r = result_of(proc)
    assert "injected fault kill at step 50" in proc.stderr and r["resumed_from_step"] == 40
    assert sha256(tmp_path / "m" / "model.safetensors") == sha256(fp32[0] / "model.safetensors")


def test_fsdp2_on_the_gpu_resumes_exactly(tmp_path, data):
    whole = tmp_path / "whole"
    result_of(train(data, whole, "--backend", "torch_fsdp", "--checkpoint-every-steps", "20"))
    proc = train(
        data,
        tmp_path / "m",
        "--backend",
        "torch_fsdp",
        "--checkpoint-every-steps",
        "20",
        "--max-restarts",
        "1",
        env={"TRAINPIPE_FAULT": "kill:0:50"},
    )
    assert result_of(proc)["resumed_from_step"] == 40
    assert max_diff(weights(tmp_path / "m"), weights(whole)) == 0.0


def test_the_loop_does_not_wait_for_a_checkpoint_being_written(tmp_path, data):
    """A 17M-parameter model (200 MB of state with momentum) checkpointed every 20 steps: the loop
    waits only for the staging (copies into pinned memory on a side stream, queued, not awaited);
    the write, much longer, runs beside the following steps."""
    r = result_of(
        train(
            data, tmp_path / "m", "--checkpoint-every-steps", "20", "--train-config", '{"hidden_units": [4096, 4096]}'
        )
    )
    c = telemetry(tmp_path / "m")["checkpoints"]
    assert c["saved"] >= 3 and c["staged_bytes"] > 100e6 and r["global_steps"] > 60
    recent = c["recent"]
    # the loop stalls only to stage, far shorter than a write; where the next checkpoint came due while the last was
    # still being written (a fast GPU takes 20 steps in less than a 200 MB write: an H200 did), it waits for that
    # write's end, never longer than the write itself took
    writes = recent["write_s"]
    for i, (stall, wait) in enumerate(zip(recent["stall_s"], recent["wait_s"], strict=True)):
        assert stall < writes[i], recent
        assert i == 0 or wait <= writes[i - 1], recent


def test_sigterm_exits_75_after_a_checkpoint_and_the_retry_resumes_exactly(tmp_path, data):
    args = [
        "--train-function",
        "teampkg.slow:train",
        "--train-config",
        '{"sleep_s": 0.01}',
        "--checkpoint-every-s",
        "0",
    ]
    whole = tmp_path / "whole"
    result_of(train(data, whole, *args, env=TEAM))
    out = tmp_path / "m"
    cmd = [
        sys.executable,
        "-m",
        "trainpipe.components.train_model",
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--tracking-uri",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--device",
        "cuda",
        "--nproc-per-node",
        NPROC,
        "--epochs",
        "2",
        "--batch-size",
        "256",
        *args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **TEAM})
    while not (out / "metrics.jsonl").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    t = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75 and time.monotonic() - t < 10, err[-3000:]
    assert "preempted by SIGTERM at step" in err.strip().splitlines()[-1]
    r = result_of(train(data, out, *args, env=TEAM))
    assert r["resumed_from_step"] > 0
    assert sha256(out / "model.safetensors") == sha256(whole / "model.safetensors")


def test_a_conv_net_with_dropout_trains_to_the_same_weights_twice(tmp_path, data):
    """What exact resume rests on: the same steps give the same bits. A 1-D CNN's backward pass on cuDNN may sum
    in another order each run unless the context keeps cuDNN to its deterministic algorithms (the SIGTERM resume
    below differed from its uninterrupted run on an H200 on 2026-11-28, an MLP's did not)."""
    args = ["--train-function", "teampkg.train:train"]
    a, b = tmp_path / "a", tmp_path / "b"
    result_of(train(data, a, *args, env=TEAM))
    result_of(train(data, b, *args, env=TEAM))
    assert sha256(a / "model.safetensors") == sha256(b / "model.safetensors")
