"""tune_model's study and trial logic in process: settings refused where they are read, a study's own folder,
the sampler's seed apart from the split's, the trial a study takes from a Pareto front, the names a trial's
scores take in MLflow, and the epoch gate through which a trial's training hears the pruner. Real trainings
run in tests/integration/test_tune_model.py."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainpipe.components.tune_model import core, summary, trial
from trainpipe.components.tune_model import study as studies
from trainpipe.components.tune_model.spec import (
    SCORED,
    SIZE_OBJECTIVES,
    VALIDATION_METRICS,
    TuneModelConfig,
    TuneModelParams,
)
from trainpipe.contract.config import build
from trainpipe.contract.errors import InputError
from trainpipe.contract.lineage import Lineage
from trainpipe.data.scoring import TASK_METRICS
from trainpipe.training.builtin import EPOCH_LOGS
from trainpipe.training.control import EpochGate

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures"
LR = {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}}


def _config(tmp_path: Path, **extra) -> TuneModelConfig:
    values = {"data": str(tmp_path / "data.csv"), "output_dir": str(tmp_path / "out"), "space": LR, **extra}
    return build(TuneModelConfig, values, where="tune_model")


# --- settings refused where they are read ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--space", '{"train_config.learning_rate": {"type": "float", "low": 0.1, "high": 0.01}}'], "inverted"),
        (["--space", '{"epochs": {"type": "int", "low": 3, "high": 3}}'], "a search space over a constant"),
        (["--space", '{"batch_size": {"type": "categorical", "choices": [64]}}'], "a search space over a constant"),
        (["--space", '{"batch_size": {"type": "categorical", "choices": []}}'], "at least two choices"),
        (
            ["--space", '{"learning_rate": {"type": "float", "low": 0.01, "high": 0.1}}'],
            "'learning_rate' is not a train_model setting",
        ),
        (["--space", '{"epochs": {"type": "int"}}'], "int needs low and high"),
        (["--space", '{"seed": {"type": "int", "low": 0, "high": 3}}'], "'seed' is not a train_model setting"),
        (["--space", "{}"], "give at least one parameter"),
        # what the default pruner cannot read of the built-in's curve: refused here, not at a trial's first epoch
        (
            ["--space", json.dumps(LR), "--objectives", '[{"metric": "log_loss"}]'],
            "field 'objectives': builtin:mlp logs loss, accuracy each epoch (classification), not 'log_loss', "
            "which the median pruner reads: set pruner: none",
        ),
        (
            ["--space", json.dumps(LR), "--objectives", '[{"metric": "val_loss", "direction": "minimize"}]'],
            "not 'val_loss': name one of those as the metric",
        ),
        (
            ["--space", json.dumps(LR), "--train", '{"task": "regression"}', "--objectives", '[{"metric": "rmse"}]'],
            "builtin:mlp logs loss each epoch (regression), not 'rmse', which the median pruner reads",
        ),
    ],
)
def test_a_bad_search_space_or_objective_is_one_line_and_exit_2(tmp_path, extra, message):
    """Through the entrypoint as a container runs it, in process: the config is refused before any study."""
    from trainpipe.contract.entrypoint import run

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = run(
            "tune_model", TuneModelConfig, core.tune_model, ["--data", "x.csv", "--output-dir", str(tmp_path)] + extra
        )
    log = err.getvalue()
    assert code == 2, log[-2000:]
    assert message in log.strip().splitlines()[-1] and "Traceback" not in log, log[-2000:]
    assert not (tmp_path / "study.db").exists()


METRICS = st.sampled_from([*SCORED, "loss", "val_loss", "accuracy"])
#: What each team function of tests/fixtures logs each epoch, as its source says (None: it hands ctx to
#: another function, so only its first epoch tells).
TEAM_LOGS = {
    "teampkg.typed:train": ("val_loss",),
    "teampkg.train:train": ("accuracy", "loss"),
    "teampkg.wrapped:train": None,
}


@settings(max_examples=80, deadline=None)
@given(
    metrics=st.lists(METRICS, min_size=1, max_size=3, unique=True),
    task=st.sampled_from(sorted(EPOCH_LOGS)),
    pruner=st.sampled_from(["median", "none"]),
    function=st.sampled_from(["builtin:mlp", "builtin:cnn", *TEAM_LOGS]),
)
def test_an_objective_the_study_cannot_read_of_the_function_is_refused_at_config_time(metrics, task, pruner, function):
    """A built-in's curve holds what it logs (EPOCH_LOGS), a team function's what its source's ctx.log calls
    name: every objective the study must read there (each one it does not score; the first when it prunes) is
    there, or the settings are refused naming it. A team function whose source does not say (it hands ctx on)
    is known only once it runs (its first epoch says)."""
    objectives = [{"metric": m, **({} if m in SCORED else {"direction": "minimize"})} for m in metrics]
    space = LR if function.startswith("builtin") else {"train_config.learning_rate": LR["train_config.learning_rate"]}
    values = {"space": space, "objectives": objectives, "pruner": pruner}
    values["train"] = {"task": task, "train_function": function}
    logs = EPOCH_LOGS[task] if function.startswith("builtin") else TEAM_LOGS[function]
    pruning = pruner != "none" and len(metrics) == 1
    needed = [m for i, m in enumerate(metrics) if m not in SCORED or (i == 0 and pruning)]
    unreadable = logs is not None and any(m not in logs for m in needed)
    other_task = [m for m in metrics if m in VALIDATION_METRICS and m not in TASK_METRICS[task]]
    with _team_on_path():
        try:
            build(TuneModelParams, values, where="tune_model")
        except InputError as exc:
            said = str(exc)
            if other_task:  # scored, but of the other task: refused first, whatever the curve holds
                assert f"'objectives': {other_task[0]!r} is not a metric of a {task} task" in said, said
                return
            if "'objectives'" not in said or "each epoch" not in said:
                assert len(metrics) > 1 and pruner == "median", said  # several objectives: the pruner's own rule
                return
            assert unreadable, said
            assert logs is not None and f"{function} logs {', '.join(logs)} each epoch" in said, said
            assert repr(next(m for m in needed if m not in logs)) in said, said
            return
    assert not unreadable and not other_task


def test_an_objective_of_another_task_is_refused_at_config_time():
    """Before: ``r2`` on a classification with ``pruner: none`` passed the config and the dry run; the real run
    failed once the baseline trial had trained ("'r2' is not a metric of this task")."""
    values = {"space": LR, "objectives": [{"metric": "r2"}], "pruner": "none", "train": {"task": "classification"}}
    with pytest.raises(InputError) as refused:
        build(TuneModelParams, values, where="tune_model")
    assert "'objectives': 'r2' is not a metric of a classification task (it has accuracy" in str(refused.value)
    assert "set train.task: regression" in str(refused.value)
    build(TuneModelParams, {**values, "train": {"task": "regression"}}, where="tune_model")


@contextlib.contextmanager
def _team_on_path():
    import sys

    sys.path.insert(0, str(FIXTURES))
    try:
        yield
    finally:
        sys.path.remove(str(FIXTURES))


def test_the_builtins_log_each_epoch_what_epoch_logs_says():
    """EPOCH_LOGS is what the config check trusts: it is what the built-ins' ctx.log calls name."""
    import ast

    import trainpipe.training as training

    root = Path(training.__file__).parent
    logged = set()
    for name in ("torch/builtin.py", "tf/builtin.py"):
        for node in ast.walk(ast.parse((root / name).read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "log":
                logged |= {k.arg for k in node.keywords}
    assert logged == {m for logs in EPOCH_LOGS.values() for m in logs}


# --- one study, one set of trials -----------------------------------------------------------------------


def _study(config: TuneModelConfig):
    search = studies.search_of(config, _lineage())
    if config.study_name is None:
        config = config.model_copy(update={"study_name": studies.study_name_for(Lineage(), search)})
    return config, studies.open_study(config, search)


def _lineage() -> Lineage:
    from trainpipe.contract.lineage import SnapshotLineage

    return Lineage(snapshot=SnapshotLineage(md5="0" * 32, path="x", rev="r", remote="file:///r", repo="."))


SPACES = st.dictionaries(
    st.sampled_from(["train_config.learning_rate", "train_config.momentum", "train_config.weight_decay"]),
    st.tuples(st.floats(0.001, 0.4), st.floats(0.01, 0.5)).map(lambda t: (t[0], t[0] + t[1])),
    min_size=1,
)


@settings(max_examples=25, deadline=None)
@given(first=SPACES, second=SPACES)
def test_two_searches_in_one_folder_never_share_a_trial_folder(tmp_path_factory, first, second):
    """Whatever the two studies search: by default each has its own name, its own folder, its own trial 1."""
    tmp = tmp_path_factory.mktemp("two")

    def config(space):
        s = {k: {"type": "float", "low": lo, "high": hi} for k, (lo, hi) in space.items()}
        return _config(tmp, space=s)

    a, b = config(first), config(second)
    names = [studies.study_name_for(Lineage(), studies.search_of(c, _lineage())) for c in (a, b)]
    a, b = (c.model_copy(update={"study_name": n}) for c, n in zip((a, b), names, strict=True))
    if first == second:
        assert studies.trial_dir(a, 1) == studies.trial_dir(b, 1)  # the same search: the same study
    else:
        assert studies.trial_dir(a, 1) != studies.trial_dir(b, 1)
        assert studies.trial_dir(b, 1).parent == studies.study_dir(b) != studies.study_dir(a)


def test_a_second_study_in_the_same_folder_trains_in_its_own(tmp_path):
    """The user's case: another space, default name, same output_dir. Its trial 1 writes where the first
    study's trial 1 never did (so it resumes no checkpoint of it), and it reads its own rows."""
    first, study_a = _study(_config(tmp_path))
    old = studies.trial_dir(first, 1) / "checkpoints" / "ckpt-0000000034"
    old.mkdir(parents=True)  # the first study's trial 1 finished
    other = {"train_config.learning_rate": {"type": "float", "low": 0.001, "high": 0.01}}
    second, study_b = _study(_config(tmp_path, space=other))
    assert second.study_name != first.study_name and study_a.study_name != study_b.study_name

    run = trial.TrialRun(second, studies.study_dir(second) / studies.ROWS_FILE, "", Lineage(), None)
    settings_file = studies.trial_dir(second, 1).with_suffix(".json")
    settings_file.parent.mkdir(parents=True, exist_ok=True)
    run.command(SimpleNamespace(number=1), {}, studies.trial_dir(second, 1))
    written = json.loads(settings_file.read_text())
    assert Path(written["output_dir"]) == studies.trial_dir(second, 1)
    assert not Path(written["output_dir"], "checkpoints").exists()
    assert Path(written["data"]).parent == studies.study_dir(second)  # its rows, not the first study's


def test_a_folder_is_never_another_studys(tmp_path):
    """A study of the same name in another storage, writing to the same folder, is refused before it is made;
    one deleted from this storage and made again starts with its folder empty."""
    import optuna

    config, study = _study(_config(tmp_path, study_name="digits"))
    first_id = study.user_attrs[studies.ID_ATTR]
    (studies.trial_dir(config, 0) / "checkpoints").mkdir(parents=True)
    elsewhere = f"sqlite:///{tmp_path / 'other.db'}"
    with pytest.raises(InputError, match=r"^study_name: .* holds the trials of another study named 'digits'"):
        _study(_config(tmp_path, study_name="digits", storage=elsewhere))
    assert "digits" not in optuna.get_all_study_names(elsewhere)  # refused before it was made

    optuna.delete_study(study_name="digits", storage=studies.storage_url(config))
    again, remade = _study(_config(tmp_path, study_name="digits"))
    assert not studies.trial_dir(again, 0).exists()
    assert remade.user_attrs[studies.ID_ATTR] != first_id


def test_the_sampler_has_its_own_seed_and_the_trials_split_with_seed(tmp_path):
    def sampled(name: str, **seeds) -> list:
        config, study = _study(_config(tmp_path / name, study_name="s", **seeds))
        return [trial.sample(study.ask(), config.space) for _ in range(3)]

    assert sampled("a", seed=1, sampler_seed=7) == sampled("b", seed=2, sampler_seed=7)
    assert sampled("c", seed=1, sampler_seed=7) != sampled("d", seed=1, sampler_seed=8)

    config = _config(tmp_path / "e", seed=5, sampler_seed=11, study_name="s")
    out = studies.trial_dir(config, 0)
    out.parent.mkdir(parents=True)
    trial.TrialRun(config, tmp_path / "rows.parquet", "", Lineage(), None).command(SimpleNamespace(number=0), {}, out)
    assert json.loads(out.with_suffix(".json").read_text())["seed"] == 5


# --- the trial a study takes ------------------------------------------------------------------------------


def T(number: int, *values: float) -> SimpleNamespace:  # noqa: N802
    return SimpleNamespace(number=number, values=list(values))


@pytest.mark.parametrize(
    ("trials", "directions", "taken"),
    [
        # the front: accuracy against cost, 0.897 at nearly the cost of 0.862
        ([T(1, 0.862, 10.0), T(4, 0.897, 10.4)], ["maximize", "minimize"], 4),
        # a tie on the first objective goes to the next one
        ([T(0, 0.9, 500.0), T(2, 0.9, 120.0), T(3, 0.8, 10.0)], ["maximize", "minimize"], 2),
        # ... then to the lower number
        ([T(5, 0.9, 1.0), T(2, 0.9, 1.0)], ["maximize", "minimize"], 2),
        # minimizing first
        ([T(0, 0.40, 0.1), T(1, 0.35, 0.9)], ["minimize", "maximize"], 1),
        # one objective
        ([T(0, 0.2), T(1, 0.1), T(2, 0.3)], ["minimize"], 1),
        ([T(0, 0.2), T(1, 0.1), T(2, 0.3)], ["maximize"], 2),
    ],
)
def test_the_trial_taken_is_the_best_on_the_first_objective(trials, directions, taken):
    assert summary.choose(trials, directions).number == taken


VALUES = st.floats(-1e6, 1e6, allow_nan=False)


@given(
    st.integers(1, 3).flatmap(
        lambda k: st.tuples(
            st.lists(st.lists(VALUES, min_size=k, max_size=k), min_size=1, max_size=12),
            st.lists(st.sampled_from(["maximize", "minimize"]), min_size=k, max_size=k),
        )
    ),
    st.randoms(),
)
def test_the_trial_taken_is_on_the_pareto_front_and_does_not_depend_on_order(case, rnd):
    rows, directions = case
    trials = [T(i, *v) for i, v in enumerate(rows)]
    best = summary.choose(trials, directions)

    def better(a, b):  # a at least as good on every objective, better on one
        sign = [1 if d == "maximize" else -1 for d in directions]
        pairs = [(s * x, s * y) for s, x, y in zip(sign, a.values, b.values, strict=True)]
        return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)

    assert not any(better(t, best) for t in trials)
    first = [t.values[0] for t in trials]
    assert best.values[0] == (max(first) if directions[0] == "maximize" else min(first))
    shuffled = list(trials)
    rnd.shuffle(shuffled)
    assert summary.choose(shuffled, directions) is best


# --- what a trial adds to its MLflow run -------------------------------------------------------------------


@settings(max_examples=50)
@given(
    st.dictionaries(
        st.one_of(
            st.sampled_from([*SCORED, "val_loss", "loss", "val_accuracy", "step"]), st.text(min_size=1, max_size=12)
        ),
        st.one_of(st.floats(allow_nan=True), st.integers(-(10**6), 10**6), st.booleans(), st.text(max_size=3)),
    )
)
def test_a_trial_names_its_scores_once(metrics):
    """The validation scores as val_<metric>, the size as parameters; what the function logged (val_loss)
    and what the training used are on the run under train_model's names already, never a doubled one."""
    out = trial.run_metrics(metrics)
    for name, value in out.items():
        assert name.removeprefix("val_") in VALIDATION_METRICS or name in SIZE_OBJECTIVES, name
        assert not name.startswith("val_val_") and value == value
    for name, value in metrics.items():
        number = isinstance(value, int | float) and not isinstance(value, bool) and value == value
        if name in VALIDATION_METRICS and number:
            assert out[f"val_{name}"] == float(value)


# --- the epoch gate ------------------------------------------------------------------------------------------


def test_the_gate_holds_the_chief_until_the_judge_answers_each_epoch(tmp_path):
    heard: list[dict] = []

    def decide(line):
        heard.append(line)
        return line["epoch"] == 2

    judge = trial._Judge(decide)
    judge.start()
    gate = EpochGate(judge.path)
    try:
        assert [gate.ask({"epoch": e, "step": 5 * (e + 1)}) for e in range(3)] == [False, False, True]
        assert [h["epoch"] for h in heard] == [0, 1, 2]  # one question an epoch, each answered
    finally:
        judge.close()
    done = threading.Event()
    threading.Thread(target=lambda: (gate.ask({"epoch": 3}), done.set()), daemon=True).start()
    assert done.wait(10)  # the judge gone: the training goes on, never held
    assert gate.ask({"epoch": 4}) is False and EpochGate(str(tmp_path / "none")).ask({"epoch": 0}) is False


def test_the_judge_prunes_on_the_first_objective_and_refuses_what_the_function_does_not_log(tmp_path):
    import optuna

    config, study = _study(_config(tmp_path, study_name="p", pruner_warmup_epochs=0))
    for _ in range(2):  # two complete trials whose training accuracy was 0.9 after epoch 1
        t = study.ask()
        t.report(0.9, 1)
        study.tell(t, 0.9)
    run = trial.TrialRun(config, tmp_path / "rows.parquet", "", Lineage(), None)
    worse = study.ask()
    assert run.judge(worse, {"epoch": 0, "step": 17, "loss": 2.0, "accuracy": 0.1}) is True
    assert worse.user_attrs["pruned_at"] == {"epoch": 1, "step": 17}
    better = study.ask()
    run._pruned, run._checked, run._reported = None, False, 0
    assert run.judge(better, {"epoch": 0, "step": 17, "loss": 0.1, "accuracy": 0.95}) is False
    run._pruned, run._checked, run._reported = None, False, 0
    assert run.judge(study.ask(), {"epoch": 0, "step": 17, "loss": 0.1}) is True  # no accuracy to prune on
    assert "logs loss each epoch, not 'accuracy'" in str(run._bad)
    assert optuna.trial.TrialState.RUNNING in [t.state for t in study.trials]


def test_the_report_draws_every_figure_without_the_imports_it_never_uses(tmp_path, monkeypatch):
    """The report's figures skip Optuna's matplotlib backend and fANOVA's forest (a study's end was 1.5 s
    slower for them): the importances are still drawn, and the modules import again afterwards."""
    import sys

    import optuna

    from trainpipe.components.tune_model import report

    spare = "tabnanny"  # a module nothing here imports: it stands for matplotlib in a process without it
    monkeypatch.delitem(sys.modules, spare, raising=False)
    with report._without((spare, "json")):
        with pytest.raises(ImportError):
            __import__(spare)
        assert json.loads("[1]") == [1]  # one imported already stays as it was
    assert __import__(spare).__name__ == spare

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_float("lr", 0.01, 0.2) - t.suggest_int("width", 8, 64) / 1000, n_trials=5)
    titles = [title for title, fig in report._figures(study, _config(tmp_path)) if fig is not None]
    assert titles == ["Optimization history: accuracy", "Parameter importances for accuracy"]
