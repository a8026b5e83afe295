"""A failure or a figure reads once and the right way round: every failed expectation named, numbers as
numbers, a compressed file called so, a ratio with its direction, probabilities scored without a warning
nobody should act on, and the retraining DAG's choice of snapshot among a backlog of events."""

from __future__ import annotations

import gzip
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.unit


def test_validate_data_names_every_failed_expectation_and_numbers_as_numbers():
    from trainpipe.components.validate_data.core import _first_per_column
    from trainpipe.components.validate_data.spec import ExpectationOutcome
    from trainpipe.contract.text import plain

    failed = [
        ExpectationOutcome(type="expect_column_values_to_be_of_type", kwargs={"column": "x"}, success=False),
        ExpectationOutcome(
            type="expect_column_values_to_not_be_null", kwargs={"column": "x"}, success=False, reason="row 3 is empty"
        ),
        ExpectationOutcome(type="expect_column_to_exist", kwargs={"column": "label"}, success=False),
    ]
    line = "; ".join(_first_per_column(failed))
    for o in failed:
        assert o.type in line, line  # one of two on column x used to be left out
    assert "row 3 is empty" in line
    assert repr(plain(np.int64(1))) == "1" and repr(plain(np.float32(0.5))) == "0.5" and plain("a") == "a"


def test_a_compressed_data_file_is_named_as_such(tmp_path):
    from trainpipe.contract.errors import InputError
    from trainpipe.data.tabular import find_dataset

    for name in ("rows.csv", "rows.csv.gz"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(b"a,label\n1,0\n"))
        with pytest.raises(InputError, match=r"is a gzip-compressed file; .*decompress it first"):
            find_dataset(path)


def test_an_optimized_variants_summary_says_which_way_each_ratio_goes():
    from trainpipe.components.optimize_model.spec import _times

    assert _times(1 / 2.22, "smaller", "larger") == "2.22x larger"  # a variant 2.2 times *larger* than fp32
    assert _times(3.0, "faster", "slower") == "3.00x faster" and _times(0.5, "faster", "slower") == "2.00x slower"
    assert _times(1.001, "faster", "slower") == "no faster or slower"


def test_probabilities_are_scored_without_a_warning():
    """float32 softmax rows sum to one only within float32's rounding: scikit-learn warned on every evaluation."""
    from trainpipe.data.scoring import classification_metrics

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(200, 10)).astype(np.float32) * 8
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y = rng.integers(0, 10, size=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = classification_metrics(y, proba, 10)["metrics"]
    assert 0 <= metrics["accuracy"] <= 1 and np.isfinite(metrics["log_loss"])


def _event(snapshot_dir: str, made_at: str, **extra) -> SimpleNamespace:
    return SimpleNamespace(extra={"changed": True, "snapshot_dir": snapshot_dir, "made_at": made_at, **extra})


def test_the_retraining_dag_takes_the_newest_snapshot_of_a_backlog_whatever_order_airflow_gives():
    from trainpipe.pipelines.dag_gates import new_snapshot

    backlog = [_event(f"/snap/{i}", f"2026-11-25T10:0{i}:00+00:00") for i in range(5)]
    for order in (backlog, backlog[::-1], [backlog[2], backlog[4], backlog[0], backlog[3], backlog[1]]):
        assert new_snapshot({"asset": order}) == "/snap/4"
    # events from before made_at existed: the event's own timestamp decides
    import datetime

    old = [
        SimpleNamespace(extra={"changed": True, "snapshot_dir": f"/o/{i}"}, timestamp=datetime.datetime(2026, 1, i + 1))
        for i in range(3)
    ]
    assert new_snapshot({"asset": old[::-1]}) == "/o/2"


def test_the_retraining_dag_leaves_a_snapshot_to_the_run_that_trains_it(capsys):
    from trainpipe.pipelines.dag_gates import new_snapshot

    mine = _event("/snap/9", "2026-11-25T11:00:00+00:00", trained_by="run manual__1 of trainpipe_training")
    assert new_snapshot({"asset": [mine]}) is False
    assert "not retraining: run manual__1 of trainpipe_training trains this snapshot itself" in capsys.readouterr().out


def _summary(step_ms: float, data_ms: float, busy: float | None) -> dict:
    return {
        "step_time_ms": {"mean": step_ms},
        "breakdown_ms": {"data": data_ms, "other": 0.0},
        "world_size": 1,
        "threads_per_rank": 1,
        "rank_skew": 1.0,
        "gpu_utilization_pct": {"0": busy} if busy is not None else None,
        "mfu": 0.2,
    }


def test_profile_advice_fits_a_host_bound_gpu_step_with_its_rows_on_the_device():
    """The H100's narrow shape: 2 ms steps, the rows on the device, a quarter of the step gathering them. It was
    told to load batches in DataLoader workers; the step is bound by the host."""
    from trainpipe.components.profile_training.core import recommend

    rank = {"device": "cuda:0", "rows_on": "device", "usable_cpus": 16, "local_world": 1, "steps": [{"samples": 4096}]}
    advice = " ".join(recommend(_summary(2.02, 0.46, 71.0), [rank]))
    assert "bound by the host" in advice and "CUDA graphs" in advice and "num_workers" not in advice
    # the same share of data time on the host, where batches are copied ahead: background workers do help
    cpu_rank = {**rank, "device": "cpu", "rows_on": "host"}
    assert "num_workers" in " ".join(recommend(_summary(20.0, 5.0, None), [cpu_rank]))
