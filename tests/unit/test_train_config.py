"""train_model's config rules, row sharding and thread budget, without starting ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.contract.config import build
from trainpipe.contract.errors import InputError
from trainpipe.contract.resources import threads_per_rank
from trainpipe.training.data import rank_batches, steps_per_epoch

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
        ({"nproc_per_node": 3, "batch_size": 64}, "field 'batch_size': 64 must be divisible by the world size 3"),
        ({"nnodes": 2, "nproc_per_node": 2, "batch_size": 6}, "world size 4"),
        ({"precision": "fp8"}, "precision"),
        ({"train_function": "os.path"}, "field 'train_function': 'os.path' is neither"),
        ({"train_function": "builtin:gbm"}, "unknown built-in 'builtin:gbm'"),
        ({"task": "ranking"}, "task"),
        ({"epochs": -1}, "epochs"),
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


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"learning_rate": 1e9}, "train_config field 'learning_rate'"),
        ({"image_shape": [8]}, "train_config field 'image_shape': give"),
        ({"hidden_units": [0]}, "hidden_units"),
        ({"width": 3}, "train_config field 'width': unknown key"),
        ({"loss": "mse"}, "mse is a regression loss"),
    ],
)
def test_bad_builtin_train_config_is_one_line(config, message):
    from trainpipe.training.builtin import parse

    with pytest.raises(InputError) as exc:
        parse(config, "classification")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_threads_per_rank_respects_the_cpu_budget(monkeypatch, capsys):
    monkeypatch.setattr("trainpipe.contract.resources.usable_cpus", lambda: 4)
    assert threads_per_rank(2) == 2 and threads_per_rank(3) == 1
    assert threads_per_rank(8) == 1
    assert "oversubscribed" in capsys.readouterr().err


def test_tensorflow_threads_follow_omp_num_threads(monkeypatch, tmp_path):
    """An OMP_NUM_THREADS the user set also sizes TF's pools (it used to leave each TF worker on every core)."""
    from trainpipe.training.preflight import rank_env

    for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("trainpipe.contract.resources.usable_cpus", lambda: 4)
    config = build(
        TrainModelConfig,
        {
            "data": str(tmp_path),
            "output_dir": str(tmp_path / "o"),
            "backend": "tensorflow",
            "nproc_per_node": 2,
            "device": "cpu",
        },
    )
    env = rank_env(config)
    assert (env["OMP_NUM_THREADS"], env["TF_NUM_INTRAOP_THREADS"], env["TF_NUM_INTEROP_THREADS"]) == ("2", "2", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env = rank_env(config)
    assert (env["OMP_NUM_THREADS"], env["TF_NUM_INTRAOP_THREADS"]) == ("1", "1")
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "3")
    assert rank_env(config)["TF_NUM_INTRAOP_THREADS"] == "3"


def test_usable_cpus_follow_the_cgroup_quota_not_the_host(tmp_path):
    from trainpipe.contract.resources import usable_cpus

    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs -> 1
    assert usable_cpus(str(tmp_path)) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(str(tmp_path)) == len(__import__("os").sched_getaffinity(0))
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert usable_cpus(str(v1)) == 1


@pytest.fixture(scope="module")
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _wrap(model, forward_sync_buffers=None):
    """DDP's wrapping as a rank of two does it, without starting a second rank."""
    import torch

    from trainpipe.components.train_model.spec import TrainModelConfig
    from trainpipe.training.torch.strategies import DDPStrategy

    strategy = DDPStrategy(TrainModelConfig(data="x", output_dir="y"))
    return strategy.wrap(model, torch.device("cpu"), 2, forward_sync_buffers)


def test_ddp_resends_buffers_each_step_only_for_running_statistics(one_rank_group, monkeypatch):
    """Constant buffers (the built-in nets' standardization, a team's fixed scale) are sent once
    when DDP wraps the model, not before every forward pass; BatchNorm's running statistics are.
    (``broadcast_buffers`` is the older torch's name; 2.13 keeps it as a view of ``forward_sync_buffers``.)"""
    from torch import nn

    from trainpipe.services.serving.nets import cnn, mlp

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "fixtures"))
    from teampkg.models import SeqConvNet

    for net in (mlp(64, 10, [32]), cnn(64, 10, [1, 8, 8]), mlp(8, 1, [16], task="regression"), SeqConvNet()):
        assert any(True for _ in net.buffers())  # the nets have buffers, and those are constant
        assert _wrap(net).broadcast_buffers is False
    batchnorm = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    assert _wrap(batchnorm).broadcast_buffers is True
    assert (
        _wrap(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, track_running_stats=False))).broadcast_buffers is False
    )
    assert _wrap(mlp(64, 10, [32]), forward_sync_buffers=True).broadcast_buffers is True


def test_a_model_class_of_the_framework_is_imported_where_it_is_served_not_shipped(monkeypatch):
    """A team that saves a plain ``torch.nn.Linear`` must not ship all of torch inside its model
    (it did: 663 MB and 6,916 files copied into every logged model, minutes of upload)."""
    import torch

    from trainpipe.training.builders import builder_reference

    assert builder_reference(torch.nn.Linear) == ("torch.nn.modules.linear:Linear", [])
    assert builder_reference("torch.nn:Sequential") == ("torch.nn:Sequential", [])
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "fixtures"))
    assert builder_reference("teampkg.models:SeqConvNet") == (
        "teampkg.models:SeqConvNet",
        ["teampkg"],
    )  # a team's own code still travels
