"""The gate and the champion rule, as pure functions."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainpipe.components.evaluate_model.core import decide
from trainpipe.components.register_model.core import should_move_champion
from trainpipe.contract.errors import AliasMoved
from trainpipe.data.scoring import regression_metrics

pytestmark = pytest.mark.unit

CHAMP = {"version": "3", "run_id": "r3", "metrics": {"accuracy": 0.90, "log_loss": 0.30}}


def test_threshold_pass_without_champion_says_so():
    d = decide({"accuracy": 0.91}, {"accuracy": 0.8})
    assert d.passed and not d.compared_with_champion and not d.beats_champion
    assert d.reasons == [
        "accuracy 0.9100 >= threshold 0.8000",
        "no champion yet: decided by the absolute thresholds alone",
    ]


def test_threshold_fail_lists_the_failure():
    d = decide({"accuracy": 0.7, "log_loss": 0.9}, {"accuracy": 0.8, "log_loss": 0.5})
    assert not d.passed
    assert d.failures == ["accuracy 0.7000 < threshold 0.8000", "log_loss 0.9000 > maximum 0.5000"]


def test_champion_better_fails_the_challenger():
    d = decide({"accuracy": 0.88}, {"accuracy": 0.8}, CHAMP, max_regression={"accuracy": 0.01})
    assert not d.passed and d.compared_with_champion and not d.beats_champion
    assert "worse by 0.0200 (may regress by <= 0.0100): fails" in d.failures[0]


def test_challenger_better_beats_the_champion():
    d = decide({"accuracy": 0.93, "log_loss": 0.2}, {"accuracy": 0.8}, CHAMP, {"accuracy": 0.01}, {"log_loss": 0.0})
    assert d.passed and d.beats_champion
    assert any("accuracy 0.9300 vs champion version 3 0.9000: better by 0.0300" in r for r in d.reasons)
    assert any("log_loss 0.2000 vs champion version 3 0.3000: better by 0.1000" in r for r in d.reasons)


def test_min_improvement_not_reached_fails():
    d = decide({"accuracy": 0.905}, {}, CHAMP, {"accuracy": 0.01})
    assert not d.passed and "needs >= +0.0100" in d.failures[0]


@pytest.mark.parametrize("bad", [float("nan"), None])
def test_nan_or_missing_metric_fails_closed(bad):
    metrics = {"accuracy": bad} if bad is not None else {}
    assert not decide(metrics, {"accuracy": 0.1}).passed
    champ = {**CHAMP, "metrics": {"accuracy": float("nan")}}
    d = decide({"accuracy": 0.99}, {}, champ, max_regression={"accuracy": 0.0})
    assert not d.passed and "missing or NaN, fails closed" in d.failures[0]


def test_uncomparable_champion_is_stated_and_thresholds_decide():
    d = decide(
        {"accuracy": 0.9}, {"accuracy": 0.8}, {"version": "2", "skipped": "it predicts other classes than this model"}
    )
    assert d.passed and not d.compared_with_champion
    assert "champion version 2 not compared (it predicts other classes than this model)" in d.reasons[-1]


def test_champion_moves_only_on_a_decision_against_it():
    v = lambda n: SimpleNamespace(version=n)  # noqa: E731
    assert should_move_champion({"beats_champion": False}, None, "1")[0]
    assert should_move_champion({"beats_champion": True, "champion": {"version": "1"}}, v("1"), "2")[0]
    assert not should_move_champion({"beats_champion": False}, v("1"), "2")[0]
    with pytest.raises(AliasMoved) as e:
        should_move_champion({"beats_champion": True, "champion": {"version": "1"}}, v("4"), "5", "prod")
    assert "the gate compared the model with version 1 under 'prod', but prod is now version 4" in str(e.value)
    assert e.value.exit_code == 10 and "\n" not in str(e.value)


VERSIONS = st.sampled_from(["1", "2", "3"])
DECISIONS = st.fixed_dictionaries(
    {"passed": st.just(True)},
    optional={
        "model_name": st.sampled_from(["m", None]),
        "champion": st.one_of(
            st.none(),
            st.fixed_dictionaries({"version": VERSIONS}),
            st.fixed_dictionaries({"version": VERSIONS, "skipped": st.just("it predicts other classes")}),
        ),
        "beats_champion": st.booleans(),
    },
).filter(lambda d: not d.get("beats_champion") or (d.get("champion") and "skipped" not in d["champion"]))


@given(DECISIONS, st.one_of(st.none(), VERSIONS), st.sampled_from(["3", "4"]), st.sampled_from(["champion", "prod"]))
def test_the_serving_alias_never_leaves_a_holder_the_gate_did_not_beat(decision, holder, version, alias):
    """Whatever the gate decided and whoever holds the alias when register_model looks again under its
    lease: it moves only away from nobody or from the version the gate beat, and a holder that changed
    since the gate decided to move it is refused in one line (exit 10), never passed over in silence."""
    current = SimpleNamespace(version=holder) if holder is not None else None
    compared = (decision.get("champion") or {}).get("version")
    gate_would_move = decision.get("beats_champion") or (decision.get("model_name") and not decision.get("champion"))
    try:
        moved, why = should_move_champion(decision, current, version, alias)
    except AliasMoved as exc:
        assert holder not in (None, version, compared if decision.get("beats_champion") else None)
        assert gate_would_move and f"{alias} is now version {holder}" in str(exc) and "\n" not in str(exc)
        return
    if moved:
        assert holder is None or (decision.get("beats_champion") and holder == compared)
    else:
        assert holder is not None and (holder == version or not gate_would_move)
    assert alias in why


@given(st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,20}", fullmatch=True), st.sampled_from([None, CHAMP]))
def test_the_gate_names_the_alias_it_compared(alias, champion):
    """A gate that compared with the holder of ``prod`` says prod in every line, not champion."""
    d = decide({"accuracy": 0.95, "log_loss": 0.2}, {"accuracy": 0.8}, champion, {"log_loss": 0.05}, alias=alias)
    about_holder = [r for r in d.reasons if "version 3" in r or "yet" in r]
    assert about_holder and all(f"{alias} version 3" in r or f"no {alias} yet" in r for r in about_holder)
    assert alias == "champion" or not any("champion" in r and "champion" not in alias for r in d.reasons)


def test_regression_metrics():
    m = regression_metrics([1.0, 2.0, 3.0], [1.0, 2.0, 5.0])
    assert (
        m["mae"] == pytest.approx(2 / 3)
        and m["rmse"] == pytest.approx((4 / 3) ** 0.5)
        and m["r2"] == pytest.approx(-1.0)
    )


@pytest.mark.parametrize(
    ("decided", "given", "named"),
    [
        ({"model_name": "m", "alias": "champion"}, {"alias": "production"}, "'production' of 'm'"),
        ({"model_name": "other", "alias": "champion"}, {}, "'champion' of 'other'"),
    ],
)
def test_register_refuses_an_alias_or_model_the_gate_did_not_compare(tmp_path, decided, given, named):
    """A pipeline that set ``alias: production`` on register_model alone: the gate compared with champion
    (none yet) and passed; registering would leave production where it was. Refused, before MLflow is asked."""
    from trainpipe.components.register_model.core import register_model
    from trainpipe.components.register_model.spec import RegisterModelConfig
    from trainpipe.contract.config import build
    from trainpipe.contract.errors import InputError
    from trainpipe.contract.lineage import Lineage

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "decision.json").write_text(json.dumps({"passed": True, **decided}))
    config = build(
        RegisterModelConfig,
        {
            "model": str(tmp_path / "m"),
            "decision": str(tmp_path / "d"),
            "output_dir": str(tmp_path / "o"),
            "model_name": "m",
            "tracking_uri": "http://127.0.0.1:9",
            **given,
        },
    )
    with pytest.raises(InputError) as exc:
        register_model(config, Lineage())
    text = str(exc.value)
    assert "evaluate_model compared the model with" in text and named in text and "\n" not in text
