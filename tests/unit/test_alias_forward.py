"""The serving alias only moves forward: a tie keeps the champion, an older or reused version never takes it,
and a registration that lost the race compares itself once with the new holder (issue 53, §2)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainpipe.components.evaluate_model.core import decide
from trainpipe.components.evaluate_model.spec import EvaluateModelParams
from trainpipe.components.register_model.core import should_move_champion
from trainpipe.contract.errors import AliasMoved
from trainpipe.services import gate

pytestmark = pytest.mark.unit

CHAMP = {"version": "2", "run_id": "r2", "metrics": {"accuracy": 0.90, "log_loss": 0.30}}
DEFAULT_RULES = {"max_regression": {"accuracy": 0.0}}  # evaluate_model's default for a classifier


def v(n: str) -> SimpleNamespace:
    return SimpleNamespace(version=n, tags={})


def test_a_tie_passes_the_gate_but_keeps_the_champion():
    """Equal accuracy (the only compared metric by default), worse log loss: it used to beat the champion."""
    d = decide({"accuracy": 0.90, "log_loss": 0.35}, {"accuracy": 0.8}, CHAMP, **DEFAULT_RULES)
    assert d.passed and d.compared_with_champion and not d.beats_champion
    assert (
        "a tie with champion version 2: no compared metric (accuracy) is better; champion version 2 stays"
        in (d.reasons[-1])
    )
    assert d.rules["tie_tolerance"] == 0.0 and d.rules["max_regression"] == {"accuracy": 0.0}


def test_an_identical_model_never_beats_its_champion():
    d = decide(dict(CHAMP["metrics"]), {}, CHAMP, {"accuracy": 0.0}, {"log_loss": 0.0})
    assert d.passed and not d.beats_champion


def test_strictly_better_beats_it_and_the_tolerance_says_by_how_much():
    better = {"accuracy": 0.903, "log_loss": 0.30}
    assert decide(better, {}, CHAMP, **DEFAULT_RULES).beats_champion
    within = decide(better, {}, CHAMP, **DEFAULT_RULES, tie_tolerance=0.005)
    assert within.passed and not within.beats_champion and "within tie_tolerance 0.005" in within.reasons[-1]
    assert decide({"accuracy": 0.91}, {}, CHAMP, **DEFAULT_RULES, tie_tolerance=0.005).beats_champion


def test_no_comparison_rules_show_nothing_better():
    d = decide({"accuracy": 0.99}, {}, CHAMP, {}, {})
    assert d.passed and not d.beats_champion and "not shown better" in d.reasons[-1]


def test_the_tolerance_is_a_setting_and_never_negative():
    assert EvaluateModelParams().tie_tolerance == 0.0
    assert EvaluateModelParams(tie_tolerance=0.01).tie_tolerance == 0.01
    with pytest.raises(ValueError, match="tie_tolerance"):
        EvaluateModelParams(tie_tolerance=-0.1)


def test_rules_travel_through_the_decision_unchanged():
    rules = gate.Rules({"f1_macro": 0.01}, {"accuracy": 0.0}, 0.002, frozenset({"log_loss", "cost"}))
    assert gate.Rules.of(rules.to_dict()) == rules


def test_never_to_a_version_older_than_the_champion():
    """The gate beat champion 8 with a model whose identical twin is version 2: 8 → 2 was the defect."""
    decision = {"passed": True, "beats_champion": True, "champion": {"version": "8"}, "model_name": "m"}
    move, why = should_move_champion(decision, v("8"), "2")
    assert not move and "older than champion version 8" in why
    assert should_move_champion(decision, v("8"), "9")[0]
    assert should_move_champion(decision, v("8"), "10")[0]  # numbers, not strings: 10 comes after 8


def test_an_identical_model_of_another_run_leaves_the_alias_where_it_is():
    decision = {"passed": True, "beats_champion": True, "champion": {"version": "2"}, "model_name": "m"}
    move, why = should_move_champion(decision, v("2"), "3", reused_from="run-a")
    assert not move and "registered before as version 3 (training run run-a)" in why and "stays at version 2" in why
    move, why = should_move_champion({"passed": True, "model_name": "m"}, None, "3", reused_from="run-a")
    assert not move and "champion stays unset" in why


def test_a_lost_race_compares_once_with_the_new_holder():
    decision = {"passed": True, "beats_champion": True, "champion": {"version": "5"}, "model_name": "m"}
    asked = []

    def holder(better):
        def compare(current):
            asked.append(current.version)
            return better, "accuracy 0.9500 vs champion version 6 0.9400: better by 0.0100"

        return compare

    move, why = should_move_champion(decision, v("6"), "7", recompare=holder(True))
    assert move and "compared once with version 6: better" in why and asked == ["6"]
    move, why = should_move_champion(decision, v("6"), "7", recompare=holder(False))
    assert not move and "not better" in why and "challenger only" in why
    with pytest.raises(AliasMoved) as exc:
        should_move_champion(decision, v("6"), "7", recompare=holder(None), model_name="m")
    text = str(exc.value)
    assert exc.value.exit_code == 10 and "\n" not in text
    assert "champion is now version 6" in text and "not moved to version 7" in text
    assert "Next: run the pipeline again" in text and "trainpipe promote models:/m/7 --reason" in text
    with pytest.raises(AliasMoved, match="but older, and champion only moves forward"):
        should_move_champion(decision, v("9"), "7", recompare=holder(True), model_name="m")
    assert asked == ["6", "6", "6", "9"]  # once per registration, never again
