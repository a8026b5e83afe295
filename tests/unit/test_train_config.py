"""train_model's config rules, row sharding and thread budget, without starting ranks."""

from __future__ import annotations

import numpy as np
import pytest

from trainpipe.components.train_model.data import rank_batches, steps_per_epoch
from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.contract.config import build
from trainpipe.contract.errors import InputError
from trainpipe.resources import threads_per_rank

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_together_see_exactly_the_single_process_batches(world):
    n, batch = 103, 8
    single = rank_batches(n, batch, seed=3, epoch=5, rank=0, world=1)
    shards = [rank_batches(n, batch, seed=3, epoch=5, rank=r, world=world) for r in range(world)]
    assert single.shape == (steps_per_epoch(n, batch), batch)
    assert np.array_equal(np.concatenate(shards, axis=1), single)
    # every row at most once per epoch, and the order changes with the epoch
    assert len(np.unique(single)) == single.size
    assert not np.array_equal(single, rank_batches(n, batch, seed=3, epoch=6, rank=0, world=1))


def test_resuming_mid_epoch_continues_the_same_order():
    full = rank_batches(100, 10, seed=0, epoch=2, rank=1, world=2)
    assert np.array_equal(rank_batches(100, 10, seed=0, epoch=2, rank=1, world=2, start_step=4), full[4:])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"backend": "mxnet"}, "backend"),
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"nproc_per_node": 3, "batch_size": 64}, "batch_size: 64 must be divisible by the world size 3"),
        ({"nnodes": 2, "nproc_per_node": 2, "batch_size": 6}, "world size 4"),
        ({"precision": "fp8"}, "precision"),
        ({"model": "os.path"}, "model: 'os.path' is neither"),
        ({"image_shape": [8]}, "image_shape"),
        ({"epochs": -1}, "epochs"),
        ({"learning_rate": 1e9}, "learning_rate"),
        ({"unknown_key": 1}, "unknown_key"),
        ({"backend": "horovod", "horovod_binding": "tensorflow"}, "TensorFlow 2.21"),
        ({"dist_backend": "nccl", "device": "cpu"}, "nccl needs device cuda"),
    ],
)
def test_bad_settings_are_one_line_input_errors(data, message):
    with pytest.raises(InputError) as exc:
        build(TrainModelConfig, {"data": "d.csv", "output_dir": "o", **data}, where="train_model")
    text = str(exc.value)
    assert message in text and "\n" not in text


def test_threads_per_rank_respects_the_cpu_budget(monkeypatch, capsys):
    monkeypatch.setattr("trainpipe.resources.usable_cpus", lambda: 4)
    assert threads_per_rank(2) == 2 and threads_per_rank(3) == 1
    assert threads_per_rank(8) == 1
    assert "oversubscribed" in capsys.readouterr().err


def test_tensorflow_threads_follow_omp_num_threads(monkeypatch, tmp_path):
    """An OMP_NUM_THREADS the user set also sizes TF's pools (it used to leave each TF worker on every core)."""
    from trainpipe.components.train_model.core import rank_env

    for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("trainpipe.resources.usable_cpus", lambda: 4)
    config = build(TrainModelConfig, {"data": str(tmp_path), "output_dir": str(tmp_path / "o"), "backend": "tensorflow", "nproc_per_node": 2, "device": "cpu"})
    env = rank_env(config)
    assert (env["OMP_NUM_THREADS"], env["TF_NUM_INTRAOP_THREADS"], env["TF_NUM_INTEROP_THREADS"]) == ("2", "2", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env = rank_env(config)
    assert (env["OMP_NUM_THREADS"], env["TF_NUM_INTRAOP_THREADS"]) == ("1", "1")
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "3")
    assert rank_env(config)["TF_NUM_INTRAOP_THREADS"] == "3"


def test_usable_cpus_follow_the_cgroup_quota_not_the_host(tmp_path):
    from trainpipe.resources import usable_cpus

    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs -> 1
    assert usable_cpus(str(tmp_path)) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(str(tmp_path)) == len(__import__("os").sched_getaffinity(0))
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert usable_cpus(str(v1)) == 1
