"""tune_model with real trainings (2 gloo ranks each): parallel workers on one study in the local
PostgreSQL, MLflow's nested runs, the best settings trained again, a worker SIGKILLed mid-trial, the
HTML report in Chromium, and bad search spaces refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import fresh_postgres_db, make_snapshot, psycopg2_url, result_of, run_component
from tests.helpers.browser import render

pytestmark = pytest.mark.integration

SPACE = {
    "train_config.learning_rate": {"type": "float", "low": 0.005, "high": 0.2, "log": True},
    "train_config.hidden_units": {"type": "categorical", "choices": [[16], [48, 16]]},
    "batch_size": {"type": "categorical", "choices": [32, 64]},
}
TRAIN = {"epochs": 2, "nproc_per_node": 2}
SHARED = {**TRAIN, "train_function": "teampkg.barrier:train"}  # builtin:mlp; two workers each take a trial


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, digits_csv):
    return make_snapshot(tmp_path_factory.mktemp("tune-data"), digits_csv, "label")


def _worker(snapshot: Path, out: Path, *extra: str, env: dict | None = None, train: dict = TRAIN) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainpipe.components.tune_model", "--data", str(snapshot), "--output-dir", str(out)]
        + ["--space", json.dumps(SPACE), "--train", json.dumps(train), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_workers_share_a_postgresql_study_and_the_best_settings_train_to_the_best_metric(
    tmp_path, snapshot, mlflow_server
):
    """Slow on purpose (about a minute): two workers share one study of 4 trials, each a real training of 2
    gloo ranks, then the best settings train again and the report renders in Chromium. The built-in MLP trains
    behind a barrier (teampkg.barrier): a worker's first trial waits until the other worker has begun one, so each
    takes at least one however long the other takes to start."""
    import mlflow
    import optuna
    from optuna.trial import TrialState

    with fresh_postgres_db("trainpipe_tune") as db:
        storage = psycopg2_url(db)
        common = ["--storage", storage, "--n-trials", "4", "--seed", "7", "--tracking-uri", mlflow_server]
        common += ["--experiment-name", "tune-pg", "--study-name", "digits", "--run-id", "pg-run"]  # one run's workers
        barrier = {**TEAM, "TEAMPKG_BARRIER": str(tmp_path / "barrier")}
        workers = [
            _worker(
                snapshot,
                tmp_path / f"w{i}",
                *common,
                "--summarize",
                "false",
                "--worker",
                str(i),
                env={**barrier, "TEAMPKG_WORKER": str(i)},
                train=SHARED,
            )
            for i in (0, 1)
        ]
        ran = [_finish(w)["ran_here"] for w in workers]
        assert sum(ran) == 4 and all(ran), ran  # both workers took trials of the one study
        report = result_of(
            run_component(
                "tune_model",
                "--data",
                str(snapshot),
                "--output-dir",
                str(tmp_path / "report"),
                "--space",
                json.dumps(SPACE),
                "--train",
                json.dumps(SHARED),
                *common,
                env=TEAM,
            )
        )
        study = optuna.load_study(study_name="digits", storage=storage)
        states = [t.state for t in study.trials]
        first_is_baseline = bool(study.trials[0].user_attrs.get("baseline"))
    assert report["ran_here"] == 0 and len(states) == 4
    assert all(s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states), states
    assert report["complete"] + report["pruned"] == 4 and report["complete"] >= 2

    # MLflow: one parent run for the study, each trial's training nested under it
    client = mlflow.MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("tune-pg")
    parent = report["mlflow_parent_run_id"]
    children = client.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    assert len(children) == 4, [c.info.run_name for c in children]
    ran = client.get_run(parent).data  # the study's figures and labels, written in one request
    assert [ran.metrics[k] for k in ("best_accuracy", "baseline_accuracy", "trials_complete", "trials_pruned")] == [
        pytest.approx(report["best_values"][0]),
        pytest.approx(report["baseline_values"][0]),
        report["complete"],
        report["pruned"],
    ]
    labels = ("trainpipe.best_trial", "trainpipe.adopted", "trainpipe.best_params")
    assert [ran.tags[k] for k in labels] == [
        str(report["best_trial"]),
        str(report["adopted"]).lower(),
        json.dumps(report["best_params"], sort_keys=True),
    ]
    assert report["lineage"]["tuning"]["best_trial"] == report["best_trial"]

    # the settings taken (the best trial's where it beat the baseline, trial 0), trained again on the same rows
    # and split, score that trial's metric
    assert report["baseline_trial"] == 0 and first_is_baseline
    best = report["best_settings"]
    if report["adopted"]:
        assert best["train_config"]["hidden_units"] in ([16], [48, 16]) and best["epochs"] == 2
    else:  # no trial beat the baseline: the train section as given
        assert best == SHARED, best
    rows = tmp_path / "w0" / "studies" / "digits" / "tuning_rows.parquet"
    again = result_of(
        run_component(
            "train_model",
            "--data",
            str(rows),
            "--tuned",
            str(tmp_path / "report"),
            "--output-dir",
            str(tmp_path / "again"),
            "--test-fraction",
            "0.2",
            "--seed",
            "7",  # the trial's split of the tuning rows (validation_fraction, the study's seed) and its seed
            "--label-column",
            "label",
            "--tracking-uri",
            mlflow_server,
            env=TEAM,
        )
    )
    assert again["lineage"]["tuning"]["study_name"] == "digits"
    from trainpipe.contract.runtime import Runtime
    from trainpipe.data.scoring import task_metrics
    from trainpipe.data.splits import held_out_rows
    from trainpipe.services.serving.package import load_artifact

    model = load_artifact(tmp_path / "again", Runtime())
    x, y, _ = held_out_rows(str(rows), model, "label")
    taken = report["best_values"] if report["adopted"] else report["baseline_values"]
    assert task_metrics(model, x, y)["accuracy"] == pytest.approx(taken[0], abs=1e-9)

    # the report a person opens: every figure drawn, no script error
    seen = render(tmp_path / "report" / "report.html", "document.querySelectorAll('.js-plotly-plot .main-svg').length")
    assert not seen["errors"], seen["errors"]
    assert seen["value"] >= 3 and "Optimization history: accuracy" in seen["text"]
    assert "Parameter importances for accuracy" in seen["text"] and f"Best trial {report['best_trial']}" in seen["text"]


def test_a_worker_killed_mid_trial_leaves_a_consistent_study_that_completes(tmp_path, snapshot):
    """Slow on purpose (about a minute): a worker is SIGKILLed mid-trial and its trial is failed by its heartbeat
    going stale (6 s), then run again by a second worker, each trial a real training. The killed trial's training
    stopped with its worker and has an MLflow run that ended; the study's run ends when the second worker
    summarizes."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    common = ["--storage", storage, "--n-trials", "2", "--stale-after-s", "6", "--retry-failed", "1"]
    common += ["--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--pruner", "none"]
    doomed = _worker(snapshot, tmp_path / "doomed", *common, "--summarize", "false", "--worker", "0")
    deadline = time.monotonic() + 300
    trial_dir = tmp_path / "doomed" / "studies"
    # its first trial's ranks are starting (train_model writes their config) or training
    while not list(trial_dir.glob("*/trial-*/.train_config.node0.json")) and time.monotonic() < deadline:
        assert doomed.poll() is None, doomed.communicate()[1][-2000:]
        time.sleep(0.1)
    trial_config = next(trial_dir.glob("*/trial-*.json"))
    ranks = str(next(trial_dir.glob("*/trial-*/.train_config.node0.json")))
    while not _pids(ranks) and time.monotonic() < deadline:  # a rank is up: the worker dies mid-trial
        assert doomed.poll() is None, doomed.communicate()[1][-2000:]
        time.sleep(0.1)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=30)
    survivor = _worker(snapshot, tmp_path / "survivor", *common, "--resume", "true")  # another run: on purpose
    result = _finish(survivor)
    study = optuna.load_study(study_name=result["study_name"], storage=storage)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states, states
    assert states.count(TrialState.FAIL) == 1  # the dead worker's trial, failed once its heartbeat stopped
    assert result["complete"] + result["pruned"] == 2, result
    retried = [t for t in study.trials if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) is not None]
    assert len(retried) == 1, "the failed trial was not run again"
    # its training's MLflow run ended FAILED, not RUNNING forever
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("trainpipe-tuning")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("mlflow.parentRunId")]
    assert runs and not [r.info.run_name for r in runs if r.info.status == "RUNNING"], [r.info for r in runs]
    dead = next(t for t in study.trials if t.state == TrialState.FAIL)
    ended = {r.info.status for r in runs if r.data.tags.get("trainpipe.trial") == str(dead.number)}
    assert ended and ended <= {"KILLED", "FAILED"}, [(r.info.run_name, r.info.status) for r in runs]
    assert client.get_run(result["mlflow_parent_run_id"]).info.status == "FINISHED"
    # no orphan: the dead worker's training died with it (waited for, up to Kubernetes' grace period)
    deadline = time.monotonic() + 30
    while (leftover := _pids(str(trial_config))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftover, f"the killed worker's ranks outlived it: {leftover}"


def _pids(pattern: str) -> list[str]:
    """The processes whose command line holds ``pattern``."""
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def test_a_stopped_worker_ends_its_trial_and_the_studys_run_and_exits_75(tmp_path, snapshot, mlflow_server):
    """SIGTERM (the platform deleting the pod) as the worker starts a trial: the trial's training stops with it,
    the trial is failed in the study, its MLflow run and the study's end KILLED (none stays RUNNING, and the
    trial has its run even where its training had not opened one), and the worker says so in one line, exit 75:
    a retry continues the study."""
    import mlflow
    import optuna
    from optuna.trial import TrialState

    one_rank = {"epochs": 1, "nproc_per_node": 1}
    tracking = ["--tracking-uri", mlflow_server, "--experiment-name", "tune-stopped"]
    worker = _worker(snapshot, tmp_path / "t", "--pruner", "none", *tracking, train=one_rank)
    studies, deadline = tmp_path / "t" / "studies", time.monotonic() + 300
    while not list(studies.glob("*/trial-0000.json")):  # its first trial is starting
        assert worker.poll() is None and time.monotonic() < deadline, worker.communicate()[1][-2000:]
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=300)
    last = err.strip().splitlines()[-1]
    assert worker.returncode == 75, err[-3000:]
    assert last.startswith("trainpipe tune_model: preempted: stopped by SIGTERM"), last
    assert "continues the study" in last, last
    (folder,) = studies.iterdir()
    study = optuna.load_study(study_name=folder.name, storage=f"sqlite:///{tmp_path / 't' / 'study.db'}")
    assert [t.state for t in study.trials] == [TrialState.FAIL]
    client = mlflow.MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("tune-stopped").experiment_id])
    assert {r.info.run_name: r.info.status for r in runs} == {
        f"study-{folder.name}": "KILLED",
        "trial-0 (baseline)": "KILLED",
    }
    leftover = subprocess.run(["pgrep", "-f", str(folder)], capture_output=True, text=True).stdout.split()
    assert not leftover, f"the stopped worker's training outlived it: {leftover}"


def test_two_objectives_give_a_pareto_front_of_non_dominated_trials(tmp_path, snapshot):
    space = {"train_config.hidden_units": {"type": "categorical", "choices": [[8], [32], [96, 32]]}}
    result = result_of(
        run_component(
            "tune_model",
            "--data",
            str(snapshot),
            "--output-dir",
            str(tmp_path / "t"),
            "--space",
            json.dumps(space),
            "--train",
            json.dumps({"epochs": 2, "nproc_per_node": 1}),
            "--objectives",
            json.dumps([{"metric": "accuracy"}, {"metric": "parameters"}]),
            "--pruner",
            "none",
            "--n-trials",
            "3",
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}",
        )
    )
    assert result["directions"] == ["maximize", "minimize"] and result["complete"] == 3
    front = result["pareto_front"]
    assert front and result["best_trial"] in [t["number"] for t in front]

    def dominates(a, b):  # a at least as good on both, better on one
        return a[0] >= b[0] and a[1] <= b[1] and a != b

    for t in front:
        assert not any(dominates(o["values"], t["values"]) for o in front), front
    assert all(isinstance(t["params"]["train_config.hidden_units"], list) for t in front)
    assert "Pareto front" in (tmp_path / "t" / "report.html").read_text()


def test_cost_is_an_objective_and_a_study_budget_stops_it_until_a_larger_one_continues_it(tmp_path, snapshot):
    """On a profile priced at one euro per wall second: a study of accuracy against cost stops with exit 9
    once its trials have spent its max_cost (one line saying what); the same command with a larger budget
    continues the same study, keeps the trial already run, and reports a Pareto front whose costs are the
    trials' trainings' own."""
    profile = tmp_path / "priced.yaml"
    profile.write_text("name: per-second\nprices: {currency: EUR, node_hour: 3600}\n")
    space = {"train_config.hidden_units": {"type": "categorical", "choices": [[8], [32], [96, 32]]}}

    def tune(budget: str, *extra: str) -> subprocess.CompletedProcess:
        return run_component(
            "tune_model",
            *("--data", str(snapshot), "--output-dir", str(tmp_path / "t"), "--space", json.dumps(space)),
            *("--train", json.dumps({"epochs": 2, "nproc_per_node": 1}), "--pruner", "none", "--n-trials", "3"),
            *("--objectives", json.dumps([{"metric": "accuracy"}, {"metric": "cost"}]), "--max-cost", budget),
            *("--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", *extra),
            env={"TRAINPIPE_HARDWARE_PROFILE": str(profile)},
        )

    stopped = tune("0.5")
    last = stopped.stderr.strip().splitlines()[-1]
    assert stopped.returncode == 9, stopped.stderr[-3000:]
    assert last.startswith("trainpipe tune_model: error: max_cost: the study's trials spent ") and (
        "of 0.5 EUR" in last
        and "1 of 3 trials finished: a rerun with a larger budget (resume: true) continues the same study" in last
    ), last
    result = result_of(tune("1000", "--resume", "true"))
    assert result["directions"] == ["maximize", "minimize"] and result["complete"] == 3
    assert result["ran_here"] == 2  # the first run's trial is kept, not run again
    front = result["pareto_front"]
    assert front and all(t["values"][1] > 1 for t in front)  # seconds of a training, at a euro each
    costs = []
    for number in range(3):
        folder = tmp_path / "t" / "studies" / result["study_name"] / f"trial-{number:04d}"
        trained = json.loads((folder / "trainpipe.json").read_text())
        costs.append(trained["result"]["cost"])
    for trial in front:
        assert trial["values"][1] == costs[trial["number"]]
    # the study's own figures: what every trial cost, in its result, its lineage and its MLflow parent run
    assert result["cost"] == pytest.approx(sum(costs)) and result["currency"] == "EUR"
    assert result["lineage"]["tuning"]["cost"] == result["cost"]
    import mlflow

    parent = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(result["mlflow_parent_run_id"])
    assert parent.data.metrics["study_cost"] == result["cost"] and parent.data.tags["trainpipe.cost_currency"] == "EUR"
    assert f"The study's trials cost {result['cost']:.4f} EUR" in (tmp_path / "t" / "report.html").read_text()
    unpriced = run_component(
        "tune_model",
        *("--data", str(snapshot), "--output-dir", str(tmp_path / "u"), "--space", json.dumps(space)),
        *("--objectives", json.dumps([{"metric": "accuracy"}, {"metric": "cost"}]), "--pruner", "none"),
    )
    assert unpriced.returncode == 2 and unpriced.stderr.strip().splitlines()[-1].endswith(
        "objectives: the hardware profile 'local' declares no prices, so no trial has a cost (give the profile "
        "prices:, or use gpu_seconds / max_gpu_hours)"
    ), unpriced.stderr[-2000:]


TEAM = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "fixtures")}  # no TRAINPIPE_TRUSTED_MODEL_CODE
TYPED_TRAIN = {"train_function": "teampkg.typed:train", "epochs": 2, "nproc_per_node": 1}
VAL_LOSS = json.dumps([{"metric": "val_loss", "direction": "minimize"}])


def _tune(snapshot: Path, out: Path, space: dict, train: dict, *extra: str) -> subprocess.CompletedProcess:
    return run_component(
        "tune_model",
        *(
            "--data",
            str(snapshot),
            "--output-dir",
            str(out),
            "--space",
            json.dumps(space),
            "--train",
            json.dumps(train),
        ),
        *("--tracking-uri", f"sqlite:///{out.parent / 'mlflow.db'}", "--seed", "3", *extra),
        env=TEAM,
    )


def test_a_team_function_is_tuned_on_the_metric_it_logs_against_its_baseline(tmp_path, snapshot):
    """A typed team function that logs val_loss (no accuracy): the study minimizes val_loss, prunes on it,
    trusts the function it was told to train (no environment variable), starts with the train section as
    given (trial 0) and takes the best trial's settings only because they beat it. A second run of the same
    search into the same folder is refused, not answered with the first run's result; naming that study for
    another search is refused too."""
    import mlflow

    space = {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.05, "log": True}}
    train = {**TYPED_TRAIN, "train_config": {"learning_rate": 1e-7, "hidden": [16]}}  # a baseline that barely moves
    proc = _tune(snapshot, tmp_path / "t", space, train, "--objectives", VAL_LOSS, "--n-trials", "3")
    result = result_of(proc)
    assert "beats the baseline's val_loss" in proc.stderr.strip().splitlines()[-1]
    assert result["objectives"] == ["val_loss"] and result["directions"] == ["minimize"]
    assert result["baseline_trial"] == 0 and result["adopted"], result
    assert result["best_values"][0] < result["baseline_values"][0]
    assert result["best_settings"]["train_config"]["learning_rate"] >= 0.01
    tuning = result["lineage"]["tuning"]
    assert tuning["adopted"] is True and tuning["baseline_values"] == result["baseline_values"]

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("trainpipe-tuning")
    children = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{result['mlflow_parent_run_id']}'"
    )
    names = sorted(r.info.run_name for r in children)
    assert names == ["trial-0 (baseline)", "trial-1", "trial-2"], names
    for r in children:
        assert r.info.status == "FINISHED" and r.data.tags["trainpipe.trial"]
        # the scores on the validation rows once each; what the function logged is train_model's train_val_loss
        assert {"val_accuracy", "parameters", "train_val_loss"} <= set(r.data.metrics), sorted(r.data.metrics)
        assert not [m for m in r.data.metrics if m.startswith("val_val_") or m == "val_wall_seconds"]

    again = _tune(snapshot, tmp_path / "t", space, train, "--objectives", VAL_LOSS, "--n-trials", "3")
    assert again.returncode == 2 and "set resume: true to continue it" in again.stderr.strip().splitlines()[-1]
    other = {"train_config.learning_rate": {"type": "float", "low": 0.001, "high": 0.01}}
    named = ["--study-name", result["study_name"], "--objectives", VAL_LOSS]
    mixed = _tune(snapshot, tmp_path / "t", other, train, *named)
    assert mixed.returncode == 2 and "was made for another search (its space differ)" in mixed.stderr, mixed.stderr[
        -800:
    ]


def test_the_train_section_is_kept_when_no_trial_beats_it_and_a_pruned_trial_stops_at_the_decision(tmp_path, snapshot):
    """Trials that barely learn: none beats the baseline. The third is below the median of the first two at its
    first epoch: the pruner stops its training at that epoch's end (its one checkpoint is that step), the
    log says so in one line and holds no error, and its MLflow run ends KILLED."""
    import mlflow
    import optuna

    space = {"train_config.learning_rate": {"type": "float", "low": 1e-7, "high": 2e-7}}
    train = {**TYPED_TRAIN, "train_config": {"learning_rate": 0.03, "hidden": [16]}}
    prune_at_once = ["--n-trials", "3", "--pruner-warmup-epochs", "0"]
    proc = _tune(snapshot, tmp_path / "t", space, train, "--objectives", VAL_LOSS, *prune_at_once)
    result = result_of(proc)
    assert result["adopted"] is False and result["baseline_values"][0] <= result["best_values"][0]
    assert result["best_settings"]["train_config"] == train["train_config"]
    report = (tmp_path / "t" / "report.html").read_text()
    assert "the train section as given is kept" in report and "0 (baseline)" in report

    assert (result["complete"], result["pruned"]) == (2, 1), result
    study = optuna.load_study(study_name=result["study_name"], storage=f"sqlite:///{tmp_path / 't' / 'study.db'}")
    pruned = study.trials[2]
    at = pruned.user_attrs["pruned_at"]
    folder = tmp_path / "t" / "studies" / result["study_name"] / "trial-0002"
    assert at["epoch"] == 1 and sorted(p.name for p in (folder / "checkpoints").glob("ckpt-*")) == [
        f"ckpt-{at['step']:010d}"
    ]  # stopped at the end of the epoch it was pruned at: not one step, nor one epoch, later
    assert f"tune_model: trial 2 pruned at epoch 1 (step {at['step']})" in proc.stderr
    assert "error:" not in proc.stderr, proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs(
        [client.get_experiment_by_name("trainpipe-tuning").experiment_id], filter_string="tags.`trainpipe.trial` = '2'"
    )
    assert [r.info.status for r in runs] == ["KILLED"]


@pytest.mark.parametrize(
    ("objectives", "pruner", "said"),
    [
        ('[{"metric": "accuracy"}]', "median", "logs val_loss each epoch, not 'accuracy'"),
        ('[{"metric": "val_los", "direction": "minimize"}]', "none", "logs val_loss each epoch, not 'val_los'"),
    ],
)
def test_a_metric_the_function_does_not_log_fails_the_study_at_the_first_epoch(
    tmp_path, snapshot, objectives, pruner, said
):
    """teampkg.wrapped hands its ctx to teampkg.typed's function: its source does not say what it logs, so its
    first epoch does (teampkg.typed's own, read from its source, are refused before any study: test_study.py)."""
    space = {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.05}}
    train = {**TYPED_TRAIN, "train_function": "teampkg.wrapped:train", "epochs": 50}
    train["train_config"] = {"learning_rate": 0.01}
    proc = _tune(snapshot, tmp_path / "t", space, train, "--objectives", objectives, "--pruner", pruner)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert said in last and "Traceback" not in proc.stderr, last
    # stopped at the first epoch's end (its one checkpoint), not after 50 epochs, nor a step later
    (ckpt,) = (tmp_path / "t" / "studies").glob("*/trial-0000/checkpoints/ckpt-*")
    trainer = json.loads((ckpt / "trainer.json").read_text())
    assert [h["step"] for h in trainer["history"]] == [trainer["global_step"]], trainer["history"]


def test_a_trial_preempted_once_is_run_again_and_counts_once(tmp_path, snapshot):
    """Every trial's training is preempted at step 3 on its first attempt (exit 75, as a service answering late
    or a node being drained ends it): tune_model reads why from the trial's error record, runs the trial once
    more (its try number 2, so the fault is not injected again), and the study has exactly its trials, none failed."""
    space = {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.05}}
    train = {**TYPED_TRAIN, "train_config": {"learning_rate": 0.02, "hidden": [16]}}
    proc = run_component(
        "tune_model",
        *("--data", str(snapshot), "--output-dir", str(tmp_path / "t"), "--space", json.dumps(space)),
        *("--train", json.dumps(train), "--objectives", VAL_LOSS, "--n-trials", "2", "--seed", "3"),
        *("--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"),
        env={**TEAM, "TRAINPIPE_FAULT": "preempt:3"},
    )
    result = result_of(proc)
    assert (result["complete"], result["failed"], result["pruned"]) == (2, 0, 0), result
    again = [line for line in proc.stderr.splitlines() if "trying it again" in line]
    assert len(again) == 2 and all("train_model exited 75 (" in line for line in again), again
    assert not any("wrote no error record" in line for line in again), again  # why came from the record
    records = sorted(p.name for p in (tmp_path / "t" / "studies").glob("*/*.error.json"))
    assert records == [], records  # the second attempt, which succeeded, wrote none
