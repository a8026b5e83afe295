"""evaluate_model's own tests: its contract (entrypoint, faces, folder) and its gate on tiny metrics."""

from __future__ import annotations

import math

import pytest

from tests.helpers.component_contract import ComponentContract
from trainpipe.components.evaluate_model.core import decide


class TestEvaluateModelContract(ComponentContract):
    name = "evaluate_model"


@pytest.mark.unit
def test_gate_passes_when_every_threshold_is_met():
    d = decide({"accuracy": 0.95, "f1_macro": 0.9}, {"accuracy": 0.9, "f1_macro": 0.85})
    assert d.passed
    assert any("accuracy 0.9500 >= threshold 0.9000" in r for r in d.reasons)
    assert any("no champion" in r for r in d.reasons)


@pytest.mark.unit
def test_gate_fails_on_one_metric_and_lists_every_reason():
    d = decide({"accuracy": 0.95, "f1_macro": 0.5}, {"accuracy": 0.9, "f1_macro": 0.85})
    assert not d.passed
    assert any("f1_macro 0.5000 < threshold 0.8500" in r for r in d.reasons)
    assert any("accuracy" in r for r in d.reasons)


@pytest.mark.unit
def test_gate_fails_closed_on_nan_or_missing():
    assert not decide({"accuracy": math.nan}, {"accuracy": 0.1}).passed
    assert not decide({}, {"accuracy": 0.1}).passed
