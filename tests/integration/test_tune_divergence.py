"""A trial whose loss diverges (NaN) is a failed trial with its reason, the study goes on, MLflow and Optuna agree on
every trial's state, train_model's result says when the loss diverged, and a study that fails leaves no earlier
study's best settings in its folder. The team's function is written here (its package under tmp_path, on
PYTHONPATH): it trains a linear layer and, with ``diverge: true`` in its config, its loss is NaN from the first
step (and so are its weights: its model's predictions are NaN, as a real divergence leaves them)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import make_snapshot, result_of, run_component

pytestmark = pytest.mark.integration

FUNCTION = """
from typing import Any


def train(ctx: Any, config: dict) -> None:
    import torch

    data = ctx.data.table()
    net = {"in_features": data.n_features, "out_features": data.n_outputs}
    from teamdiv.models import Linear

    model = ctx.prepare(Linear(**net))
    opt = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.05)))
    ctx.restore(model=model, optimizer=opt)
    for x, y in ctx.batches(data):
        loss = torch.nn.functional.cross_entropy(model(x.float()), y)
        if config.get("diverge"):
            loss = loss * float("nan")
        ctx.backward(loss)
        ctx.step(opt)
        ctx.log(loss=loss)
    ctx.save_model(model, init_args=net)
"""
TRAIN = {"train_function": "teamdiv.train:train", "epochs": 1, "nproc_per_node": 1, "batch_size": 64}
SPACE = {
    "train_config.diverge": {"type": "categorical", "choices": [False, True]},
    "train_config.lr": {"type": "float", "low": 0.01, "high": 0.1},
}

LOSS = ("--objectives", json.dumps([{"metric": "loss", "direction": "minimize"}]))


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, digits_csv):
    return make_snapshot(tmp_path_factory.mktemp("diverge-data"), digits_csv, "label")


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("team")
    (root / "teamdiv").mkdir()
    (root / "teamdiv" / "__init__.py").write_text("")
    (root / "teamdiv" / "train.py").write_text(textwrap.dedent(FUNCTION))
    (root / "teamdiv" / "models.py").write_text("import torch\n\n\nclass Linear(torch.nn.Linear):\n    pass\n")
    return {"PYTHONPATH": str(root)}


def _tune(snapshot: Path, out: Path, team: dict, train: dict, *extra: str, space: dict = SPACE):
    return run_component(
        "tune_model",
        *("--data", str(snapshot), "--output-dir", str(out), "--space", json.dumps(space)),
        *("--train", json.dumps(train), "--tracking-uri", f"sqlite:///{out.parent / 'mlflow.db'}", *extra),
        env=team,
    )


def test_train_models_result_says_at_which_epoch_the_loss_diverged(tmp_path, snapshot, team):
    def train(diverge: bool) -> dict:
        return result_of(
            run_component(
                "train_model",
                *("--data", str(snapshot), "--output-dir", str(tmp_path / str(diverge)), "--label-column", "label"),
                *("--train-function", TRAIN["train_function"], "--epochs", "1", "--nproc-per-node", "1"),
                *("--train-config", json.dumps({"diverge": diverge}), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"),
                env=team,
            )
        )

    assert train(True)["diverged_at_epoch"] == 1
    assert train(False)["diverged_at_epoch"] is None


def test_a_diverging_trial_fails_with_its_reason_and_the_study_goes_on(tmp_path, snapshot, team):
    """Slow on purpose (about two minutes): five real trainings (a study of three finished trials beside its failed
    ones, then a study of one failed baseline), each a train_model process; the failed ones stop at their first
    epoch's end."""
    import mlflow
    import optuna
    from optuna.trial import TrialState

    out = tmp_path / "t"
    out.mkdir()
    (out / "best_settings.json").write_text(json.dumps({"an": "earlier study's"}))
    # sampler seed 1: trial 1 is sampled with diverge true, and later trials both ways (the pruner would prune a NaN
    # curve: without it, the NaN model reaches the scoring, which a diverged trial must never crash)
    proc = _tune(snapshot, out, team, TRAIN, "--n-trials", "3", "--pruner", "none", "--sampler-seed", "1")
    result = result_of(proc)
    assert (result["complete"], result["pruned"]) == (3, 0), result
    study = optuna.load_study(study_name=result["study_name"], storage=f"sqlite:///{out / 'study.db'}")
    trials = study.get_trials()
    bad = [t for t in trials if t.user_attrs["settings"].get("train_config", {}).get("diverge")]
    assert bad, "no trial sampled diverge: true (choose another sampler seed)"
    for t in bad:
        assert t.state == TrialState.FAIL, (t.number, t.state)
        assert f"trial {t.number}: its loss diverged at epoch 1" in t.user_attrs["failure"]
        assert f"tune_model: trial {t.number}: its loss diverged at epoch 1 (step " in proc.stderr
    assert all(t.state == TrialState.COMPLETE for t in trials if t not in bad)
    assert "Traceback" not in proc.stderr and "Input contains NaN" not in proc.stderr

    # MLflow says what Optuna says of every trial; a failed one says why
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("trainpipe-tuning")
    parent = result["mlflow_parent_run_id"]
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    status = {int(r.data.tags["trainpipe.trial"]): r for r in runs}
    assert sorted(status) == [t.number for t in trials]
    agree = {TrialState.COMPLETE: "FINISHED", TrialState.FAIL: "FAILED"}
    assert {n: r.info.status for n, r in status.items()} == {t.number: agree[t.state] for t in trials}
    for t in bad:
        assert "its loss diverged at epoch 1" in status[t.number].data.tags["trainpipe.failure"]

    # the folder shows this study's best settings, never the earlier one's
    best = json.loads((out / "best_settings.json").read_text())
    assert best == result["best_settings"] and not best.get("train_config", {}).get("diverge"), best

    # a study that fails (its baseline diverges: no study of that train section can) leaves no best settings
    doomed = {**TRAIN, "train_config": {"diverge": True}}
    failed = _tune(snapshot, out, team, doomed, "--n-trials", "1", "--pruner", "none")
    assert failed.returncode == 2, failed.stderr[-2000:]
    assert "the baseline trial (the train section as given) failed" in failed.stderr.strip().splitlines()[-1]
    assert "its loss diverged at epoch 1" in failed.stderr.strip().splitlines()[-1]
    assert not (out / "best_settings.json").exists() and not (out / "report.html").exists()


def test_a_study_whose_every_trial_diverges_ends_instead_of_training_forever(tmp_path, snapshot, team):
    """No baseline, every trial diverges: as many failed trials as n_trials end the study (no trial completed:
    exit 1, its line says so), the median pruner on the logged loss (a NaN curve fails the trial, never pruned).
    One trial shows it: a second failed one would only cost another training."""
    space = {"train_config.lr": {"type": "float", "low": 0.01, "high": 0.1}}
    doomed = {**TRAIN, "train_config": {"diverge": True}}
    proc = _tune(snapshot, tmp_path / "t", team, doomed, "--n-trials", "1", "--baseline", "false", *LOSS, space=space)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "1 trial failed, as many as n_trials (1)" in proc.stderr
    assert "no trial completed (0 pruned, 1 failed)" in proc.stderr.strip().splitlines()[-1]
