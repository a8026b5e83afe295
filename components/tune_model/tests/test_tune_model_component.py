"""tune_model's own tests: its contract (entrypoint, faces, folder). Its Kubeflow Trainer OptimizationJob
manifest is tested beside this file; studies run in tests/integration/test_tune_model.py.
"""

from __future__ import annotations

import pytest

from tests.helpers.component_contract import ComponentContract
from trainpipe.components.tune_model.spec import TuneModelParams
from trainpipe.contract.config import build
from trainpipe.contract.errors import InputError


class TestTuneModelContract(ComponentContract):
    name = "tune_model"


SPACE = {"batch_size": {"type": "categorical", "choices": [32, 64]}}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("objectives", "pruner"),
    [(None, "median"), ([{"metric": "accuracy"}], "median"), ([{"metric": "accuracy"}, {"metric": "cost"}], "none")],
)
def test_the_pruner_left_unset_prunes_where_optuna_can(objectives, pruner):
    """Issue 44: the README's two objectives were refused because the pruner defaulted to median, which Optuna
    cannot run on a multi-objective study. Unset, it is median for one objective and none for several."""
    given = {"space": SPACE, **({"objectives": objectives} if objectives else {})}
    assert build(TuneModelParams, given, "tune_model").pruner == pruner


@pytest.mark.unit
def test_a_median_pruner_asked_for_several_objectives_is_refused_when_the_settings_are_read():
    from trainpipe.pipelines.config import PipelineConfig

    two = [{"metric": "accuracy"}, {"metric": "parameters"}]
    with pytest.raises(InputError, match=r"field 'pruner': Optuna prunes single-objective studies only"):
        build(TuneModelParams, {"space": SPACE, "objectives": two, "pruner": "median"}, "tune_model")
    with pytest.raises(InputError, match=r"field 'tune.pruner': Optuna prunes single-objective studies only"):
        build(PipelineConfig, {"data": "d.csv", "tune": {"space": SPACE, "objectives": two, "pruner": "median"}})
