"""profile_training's own tests: its contract (entrypoint, faces, folder) and its summary of step records."""

from __future__ import annotations

import pytest

from tests.helpers.component_contract import ComponentContract
from trainpipe.components.profile_training.core import summarize
from trainpipe.contract.errors import InputError


class TestProfileTrainingContract(ComponentContract):
    name = "profile_training"


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


@pytest.mark.unit
def test_profile_summary_throughput_and_breakdown():
    s = summarize([_rank(0, 0.01), _rank(1, 0.02)], warmup_steps=2)
    assert s["world_size"] == 2 and s["steps"] == 16
    assert s["samples_per_second"] == pytest.approx(32 / 0.01 + 32 / 0.02)
    assert sum(s["breakdown_ms"].values()) == pytest.approx(s["step_time_ms"]["mean"])
    assert s["rank_skew"] == pytest.approx(2.0)


@pytest.mark.unit
def test_profile_needs_steady_steps():
    with pytest.raises(InputError, match="warmup_steps"):
        summarize([_rank(0, 0.01, n=2)], warmup_steps=5)
