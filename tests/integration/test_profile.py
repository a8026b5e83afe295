"""profile_training on real 2-rank gloo runs traced with torch.profiler."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.conftest import result_of, run_component

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, digits_csv, mlflow_server):
    root = tmp_path_factory.mktemp("prof")
    train = result_of(
        run_component(
            "train_model",
            "--data",
            str(digits_csv),
            "--output-dir",
            str(root / "m"),
            "--tracking-uri",
            mlflow_server,
            "--epochs",
            "2",
            "--batch-size",
            "64",
            "--profile-steps",
            "15",
            "--checkpoint-every-steps",
            "0",
        )
    )
    prof = result_of(
        run_component(
            "profile_training",
            "--model",
            str(root / "m"),
            "--output-dir",
            str(root / "p"),
            "--tracking-uri",
            mlflow_server,
        )
    )
    return root, train, prof


def test_throughput_agrees_with_the_profilers_own_clock(profiled):
    root, _, prof = profiled
    trace = json.loads((root / "p" / "trace.json").read_text())
    steps = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) == 15
    window = prof["profiled_window"]
    assert sorted(int(e["name"].split("#")[1]) for e in steps)[0] == window["first_step_index"]
    # torch.profiler times the same steps with its own clock: 2 ranks x 32 rows per step
    trace_throughput = 2 * 32 / (statistics.fmean(e["dur"] for e in steps) / 1e6)
    assert abs(trace_throughput - window["samples_per_second"]) / trace_throughput <= 0.10


def test_breakdown_sums_to_the_step_time_and_the_summary_is_complete(profiled):
    root, train, prof = profiled
    assert prof["world_size"] == 2 and prof["steps"] > 0
    assert set(prof["breakdown_ms"]) == {"data", "forward", "backward", "optimizer", "other"}
    assert abs(sum(prof["breakdown_ms"].values()) - prof["step_time_ms"]["mean"]) <= 0.10 * prof["step_time_ms"]["mean"]
    assert 0 < prof["cpu_utilization"] <= 1 and prof["flops_per_sample"] == 3 * 2 * (64 * 64 + 64 * 10)
    assert 0 < prof["mfu"] < 1 and prof["peak_source"].startswith("CPU estimate")
    assert prof["collective_ms_per_step"] is not None and prof["collective_ms_per_step"] > 0
    assert isinstance(prof["recommendations"], list)
    summary = json.loads((root / "p" / "summary.json").read_text())
    assert summary["samples_per_second"] == pytest.approx(prof["samples_per_second"])
    assert prof["mlflow_run_id"] == train["mlflow_run_id"]


def test_summary_is_logged_to_the_training_run(profiled, mlflow_server):
    import mlflow

    _, train, prof = profiled
    run = mlflow.MlflowClient(mlflow_server).get_run(train["mlflow_run_id"])
    assert run.data.metrics["profile_samples_per_second"] == pytest.approx(prof["samples_per_second"])
    arts = [
        a.path for a in mlflow.MlflowClient(mlflow_server).list_artifacts(train["mlflow_run_id"], "profile_training")
    ]
    assert {"profile_training/report.html", "profile_training/summary.json", "profile_training/trace.json"} <= set(arts)


def test_recommendations_name_the_cause():
    from trainpipe.components.profile_training.core import recommend

    ranks = [{"rank": 0, "usable_cpus": 2, "local_world": 4, "device": "cpu", "steps": [{"samples": 8}]}]
    summary = {
        "step_time_ms": {"mean": 1.0},
        "breakdown_ms": {"data": 0.5, "forward": 0.2, "backward": 0.2, "optimizer": 0.1},
        "threads_per_rank": 1,
        "world_size": 4,
        "collective_ms_per_step": 0.4,
        "rank_skew": 1.5,
        "mfu": None,
    }
    text = " | ".join(recommend(summary, ranks))
    for needle in (
        "Data loading takes 50%",
        "pin host memory",
        "oversubscribed: 4 ranks x 1 threads on 2 usable CPUs",
        "raise batch_size",
        "communication-bound",
        "straggler",
    ):
        assert needle in text, text


def test_a_short_profiling_pass_on_a_snapshot(tmp_path, digits_csv):
    r = result_of(
        run_component(
            "profile_training",
            "--data",
            str(digits_csv),
            "--output-dir",
            str(tmp_path / "p"),
            "--profile-steps",
            "5",
            "--train",
            '{"nproc_per_node": 2, "batch_size": 64}',
        )
    )
    assert r["world_size"] == 2 and r["trace"] == "trace.json" and r["mlflow_run_id"] is None
    assert r["profiled_window"]["steps"] == 5
    assert (tmp_path / "p" / "report.html").read_text().count("<img") == 3


def test_profile_report_renders_in_headless_chromium_with_its_charts(profiled):
    from tests.helpers.browser import render

    root, _, _ = profiled
    page = render(root / "p" / "report.html")
    assert page["errors"] == [] and page["title"] == "trainpipe training profile"
    assert [i["alt"] for i in page["images"]] == [
        "Throughput over steps",
        "Step-time breakdown",
        "Per-rank step time (skew)",
    ]
    assert all(i["width"] > 100 and i["height"] > 50 for i in page["images"])
    assert "Recommendations" in page["text"] and "samples_per_second" in page["text"]
