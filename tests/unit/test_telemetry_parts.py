"""trainpipe.services.telemetry on its own, with the contract's progress and push: progress lines, the scrape-time
collector, a node's endpoint, and telemetry that never raises."""

from __future__ import annotations

import io
import socket
import types
import urllib.request

import pytest

from tests.conftest import free_port_pair
from trainpipe.contract import progress, push
from trainpipe.services import telemetry

pytestmark = pytest.mark.unit


def test_progress_prints_at_its_cadence_with_rate_and_eta(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    out = io.StringIO()
    p = progress.Progress("train_model", 100, "batches", rate_unit=("samples", 64), every_s=2, stream=out)
    for t, done in ((0.5, 10), (1.0, 20), (2.5, 50), (3.0, 60)):  # one line, at 2.5 s
        now[0] = t
        p.update(done)
    lines = out.getvalue().splitlines()
    assert lines == ["train_model: 50/100 batches (50%), 1,280.0 samples/s, elapsed 0:02, ETA 0:02"]
    now[0] = 6.0
    p.update(100)  # the next line is due
    assert out.getvalue().splitlines()[-1].startswith("train_model: 100/100 batches (100%)")
    assert p.eta() == 0


def test_progress_of_another_rank_is_silent_and_a_resumed_run_counts_its_own_rate(monkeypatch):
    out = io.StringIO()
    quiet = progress.Progress("train_model", 10, "batches", every_s=0, stream=out, show=False)
    quiet.update(5)
    quiet.finish()
    assert out.getvalue() == ""
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    resumed = progress.Progress("train_model", 100, "batches", start=60, every_s=100, stream=out)
    now[0] = 4.0
    resumed.update(80)
    assert resumed.rate() == 5.0  # 20 batches in 4 s, not the 60 a previous process did


def _ctx(rank: int = 0, records: list | None = None):
    settings = types.SimpleNamespace(backend="torch_ddp", precision="fp32", epochs=3, train_function="builtin:mlp")
    return types.SimpleNamespace(
        settings=settings,
        rank=rank,
        world_size=2,
        dist_name="gloo",
        global_step=len(records or []),
        epoch=0,
        batches_done=len(records or []),
        step_records=list(records or []),
        restarts=0,
        last_checkpoint_unix=None,
        progress_ratio=lambda: 0.5,
        eta_seconds=lambda: 3.0,
        learning_rate=lambda: 0.1,
        last_logged=lambda: {"loss": 0.25},
        device_figures=lambda: {},
    )


def _samples(families, name):
    return [s for f in families for s in f.samples if s.name == name]


def test_the_collector_folds_steps_at_scrape_time_and_holds_the_newest_until_the_end():
    recs = [
        {"samples": 32, "step_s": 0.004, "data_s": 0.001, "forward_s": 0.001},
        {"samples": 32, "step_s": 0.2, "data_s": 0.1},
    ]
    ctx = _ctx(records=recs)
    c = telemetry.TrainingCollector(ctx, {"run_id": "r1", "model": "builtin:mlp"})
    first = list(c.collect())
    assert _samples(first, "trainpipe_training_samples_total")[0].value == 32  # the newest record may still grow
    ctx.step_records[-1]["step_s"] += 0.1  # an epoch end amends the last step
    c.final = True
    last = list(c.collect())
    assert _samples(last, "trainpipe_training_samples_total")[0].value == 64
    assert _samples(last, "trainpipe_training_step_seconds_count")[0].value == 2
    assert _samples(last, "trainpipe_training_step_seconds_sum")[0].value == pytest.approx(0.304)
    buckets = {s.labels["le"]: s.value for s in _samples(last, "trainpipe_training_step_seconds_bucket")}
    assert buckets["0.005"] == 1 and buckets["0.25"] == 1 and buckets["0.5"] == 2 and buckets["+Inf"] == 2
    phases = {s.labels["phase"]: s.value for s in _samples(last, "trainpipe_training_phase_seconds_total")}
    assert phases["data"] == pytest.approx(0.101) and "backward" not in phases
    loss = _samples(last, "trainpipe_training_logged")[0]
    assert (
        loss.labels["key"] == "loss"
        and loss.value == 0.25
        and loss.labels["run_id"] == "r1"
        and loss.labels["rank"] == ""
    )


def test_local_rank_0_answers_for_its_node_and_a_taken_port_is_one_warning(monkeypatch, capsys):
    monkeypatch.setenv(telemetry.ADDRESS_ENV, "127.0.0.1")
    port = free_port_pair()
    ranks = [
        telemetry.TrainingMetrics.serve(_ctx(rank=r, records=[{"samples": 8, "step_s": 0.01}] * 3), port, r, 2)
        for r in (0, 1)
    ]
    try:
        node = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        own = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?ranks=self", timeout=5).read().decode()
        assert {
            line.split('rank="')[1][0]
            for line in node.splitlines()
            if line.startswith("trainpipe_training_global_step")
        } == {"0", "1"}
        assert {
            line.split('rank="')[1][0] for line in own.splitlines() if line.startswith("trainpipe_training_global_step")
        } == {"0"}
        assert node.count("# TYPE trainpipe_training_global_step gauge") == 1  # one family, both ranks' samples
        again = telemetry.TrainingMetrics.serve(_ctx(rank=0), port, 0, 1)
        assert again is None
    finally:
        for r in ranks:
            r.close(finished=True)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"trainpipe telemetry: warning: metrics_port: cannot serve rank 0's metrics on 127.0.0.1:{port}"
    )


def test_without_a_pushgateway_nothing_is_pushed_and_one_that_is_down_is_one_warning(monkeypatch, capsys):
    monkeypatch.delenv(push.PUSHGATEWAY_ENV, raising=False)
    assert push.push_component("validate_data", 0, 1.0, "r", {}, "local") is False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert (
        push.push_component("validate_data", 0, 1.0, "r", {"rows": 3}, "local", url=f"http://u:pw@127.0.0.1:{closed}")
        is False
    )
    err = capsys.readouterr().err.splitlines()
    assert (
        len(err) == 1
        and "cannot push validate_data's figures to http://***@127.0.0.1:" in err[0]
        and "pw" not in err[0]
    )


def test_hashing_a_large_dataset_reports_progress_and_the_same_hash(tmp_path, monkeypatch, capsys):
    from trainpipe.contract.io import dataset_digest

    folder = tmp_path / "parts"
    folder.mkdir()
    for i in range(3):
        (folder / f"part-{i}.parquet").write_bytes(bytes([i]) * (3 << 20))
    plain = dataset_digest(folder)
    monkeypatch.setenv(progress.PROGRESS_ENV, "0")
    assert dataset_digest(folder, "snapshot_dataset: hashing the data") == plain
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(
        line.startswith("snapshot_dataset: hashing the data: ") and " MB (" in line and "MB/s" in line for line in lines
    )
    assert lines[-1].startswith("snapshot_dataset: hashing the data: 9/9 MB (100%)")


def test_validating_a_parquet_folder_counts_rows_from_the_footers(tmp_path):
    import pandas as pd

    from trainpipe.components.validate_data.core import _progress

    files = []
    for i, n in enumerate((5, 7)):
        files.append(tmp_path / f"p{i}.parquet")
        pd.DataFrame({"x": range(n)}).to_parquet(files[-1])
    assert _progress(files[:1]) is None  # one file: nothing to report between files
    progress = _progress(files)
    assert progress.total == 12 and progress.unit == "rows" and progress.what == "validate_data"
