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
def test_a_run_shorter_than_its_warmup_is_profiled_on_its_last_step(capsys):
    """A deployment trial's reference DAG failed at profile_training on 300 rows (warmup_steps 3 left no step on a
    rank), and register_model never ran: a short run is profiled on what it has, and says so."""
    s = summarize([_rank(0, 0.01, n=2), _rank(1, 0.02, n=3)], warmup_steps=5)
    assert s["steps"] == 1 + 2  # the first step of each rank is left out: the shorter rank keeps its last
    assert "warmup_steps: 5 would leave no steady-state step on a rank of 2 steps" in capsys.readouterr().err


@pytest.mark.unit
def test_a_rank_that_recorded_no_step_is_one_line():
    with pytest.raises(InputError, match="recorded no step"):
        summarize([_rank(0, 0.01, n=0)], warmup_steps=0)
