"""What ``trainpipe lineage`` prints of a lineage record, in process (no MLflow server: ``render`` takes
the record): the raw data's own md5, and what the model cost."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainpipe.contract.lineage import (
    FeaturesLineage,
    FeatureViewLineage,
    Lineage,
    SourceLineage,
    TrainingLineage,
    TrainingProfileLineage,
    TuningLineage,
)

pytestmark = pytest.mark.unit

md5s = st.text("0123456789abcdef", min_size=32, max_size=32)
money = st.floats(0, 1e6, allow_nan=False)
currencies = st.sampled_from(["USD", "EUR", "JPY"])
seconds = st.floats(0, 1e7, allow_nan=False)


def _line(text: str, head: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(head))


def _training(cost, currency, wall, gpu, cpu) -> TrainingLineage:
    return TrainingLineage(
        mlflow_run_id="r1",
        experiment_id="1",
        train_function="builtin:mlp",
        task="classification",
        backend="torch",
        dist_backend="gloo",
        device="cpu",
        world_size=2,
        model_uri="runs:/r1/model",
        precision="fp32",
        hardware_profile="cpu",
        model_sha256="ab" * 32,
        wall_seconds=wall,
        gpu_seconds=gpu,
        cpu_core_seconds=cpu,
        cost=cost,
        currency=currency if cost is not None else None,
    )


@settings(max_examples=50, deadline=None)
@given(entity_md5=md5s, set_md5=md5s, from_features=st.booleans())
def test_the_raw_data_line_shows_the_raw_files_own_md5(entity_md5, set_md5, from_features):
    """A training set joined from a feature store: the raw data is the entity table, and its md5 is the
    entity table's, also in a record written before validate_data kept it in ``source`` (it held the
    set's there); a dataset validated as it is: its own."""
    from trainpipe.services.lineage_report import render

    record = Lineage(
        source=SourceLineage(uri="/data/entities.csv", md5=set_md5, rows=10, columns=3),
        features=FeaturesLineage(
            repo="/repo",
            project="shop",
            views={"activity": FeatureViewLineage(fingerprint="cd" * 32, features=["day"])},
            entity_md5=entity_md5,
            timestamp_column="event_timestamp",
            as_of_min="2026-01-01T00:00:00+00:00",
            as_of_max="2026-01-02T00:00:00+00:00",
        )
        if from_features
        else None,
    ).to_dict()
    line = _line(render("m", SimpleNamespace(version="1", aliases=[]), record, None), "  raw data")
    assert line == f"  raw data   /data/entities.csv md5 {entity_md5 if from_features else set_md5}"


@settings(max_examples=50, deadline=None)
@given(
    cost=st.none() | money,
    currency=currencies,
    used=st.tuples(seconds, seconds, seconds),
    study=st.none() | money,
    per_epoch=st.none() | money,
)
def test_the_cost_line_says_what_training_tuning_and_an_epoch_cost(cost, currency, used, study, per_epoch):
    """Without ``--json``: the training's cost at its profile's prices (or that the profile has none) and
    what it used, the tuning study's cost and the profiled cost per epoch, each when the record has it."""
    from trainpipe.services.lineage_report import render

    wall, gpu, cpu = used
    record = Lineage(
        training=_training(cost, currency, wall, gpu, cpu),
        tuning=None
        if study is None
        else TuningLineage(
            study_name="s",
            storage="sqlite:///s.db",
            objectives=["accuracy"],
            finished_trials=3,
            best_trial=1,
            best_values=[0.9],
            cost=study,
            currency=currency,
        ),
        training_profile=None
        if per_epoch is None
        else TrainingProfileLineage(
            samples_per_second=100.0,
            step_time_ms=5.0,
            world_size=1,
            recommendations=0,
            cost_per_epoch=per_epoch,
            currency=currency,
        ),
    ).to_dict()
    line = _line(render("m", SimpleNamespace(version="1", aliases=[]), record, None), "  cost")
    training = f"{cost:.4f} {currency}" if cost is not None else "not priced: hardware profile cpu declares no prices"
    expected = [f"training {training} ({wall:g} s wall, {gpu:g} GPU-seconds, {cpu:g} CPU-core-seconds)"]
    if study is not None:
        expected.append(f"tuning study {study:.4f} {currency}")
    if per_epoch is not None:
        expected.append(f"{per_epoch:.6f} {currency} per epoch when profiled")
    assert line == "  cost       " + "; ".join(expected)


def test_a_record_without_training_says_so_in_one_dash():
    from trainpipe.services.lineage_report import render

    line = _line(render("m", SimpleNamespace(version="1", aliases=[]), {}, None), "  cost")
    assert line == "  cost       -"
