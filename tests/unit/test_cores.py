"""Cores on tiny data: the gate, the profile summary, suite loading."""

from __future__ import annotations

import math

import pytest

from trainpipe.components.evaluate_model.core import decide
from trainpipe.components.profile_training.core import summarize
from trainpipe.components.validate_data.core import load_suite
from trainpipe.contract.errors import InputError

pytestmark = pytest.mark.unit


def test_gate_passes_when_every_threshold_is_met():
    d = decide({"accuracy": 0.95, "f1_macro": 0.9}, {"accuracy": 0.9, "f1_macro": 0.85})
    assert d.passed
    assert any("accuracy 0.9500 >= threshold 0.9000" in r for r in d.reasons)
    assert any("no champion" in r for r in d.reasons)


def test_gate_fails_on_one_metric_and_lists_every_reason():
    d = decide({"accuracy": 0.95, "f1_macro": 0.5}, {"accuracy": 0.9, "f1_macro": 0.85})
    assert not d.passed
    assert any("f1_macro 0.5000 < threshold 0.8500" in r for r in d.reasons)
    assert any("accuracy" in r for r in d.reasons)


def test_gate_fails_closed_on_nan_or_missing():
    assert not decide({"accuracy": math.nan}, {"accuracy": 0.1}).passed
    assert not decide({}, {"accuracy": 0.1}).passed


def _rank(rank, step_s, n=10, samples=32):
    return {
        "rank": rank,
        "peak_rss_mb": 100.0,
        "threads": 1,
        "steps": [
            {
                "samples": samples,
                "step_s": step_s,
                "data_s": 0.1 * step_s,
                "forward_s": 0.3 * step_s,
                "backward_s": 0.4 * step_s,
                "optimizer_s": 0.2 * step_s,
            }
            for _ in range(n)
        ],
    }


def test_profile_summary_throughput_and_breakdown():
    s = summarize([_rank(0, 0.01), _rank(1, 0.02)], warmup_steps=2)
    assert s["world_size"] == 2 and s["steps"] == 16
    assert s["samples_per_second"] == pytest.approx(32 / 0.01 + 32 / 0.02)
    assert sum(s["breakdown_ms"].values()) == pytest.approx(s["step_time_ms"]["mean"])
    assert s["rank_skew"] == pytest.approx(2.0)


def test_profile_needs_steady_steps():
    with pytest.raises(InputError, match="warmup_steps"):
        summarize([_rank(0, 0.01, n=2)], warmup_steps=5)


def test_default_suite_is_generic(tmp_path):
    suite = load_suite("builtin:default", "target")
    cols = {e["kwargs"].get("column") for e in suite["expectations"]}
    assert "target" in cols
    bad = tmp_path / "s.json"
    bad.write_text('{"name": "x", "expectations": []}')
    with pytest.raises(InputError, match="non-empty 'expectations'"):
        load_suite(str(bad), "y")
