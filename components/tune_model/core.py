"""tune_model: the work. optuna, mlflow, pandas and plotly are imported inside the functions.

A study (Optuna, RDB storage: SQLite by default, PostgreSQL where workers share it) whose trials are
real train_model trainings, each a subprocess of this worker that dies with it. The trials train on
the training side of the snapshot's split (the rows evaluate_model later holds out are never read)
and are scored on a validation share of it. A trial's training reports its per-epoch metric, which
the pruner compares with earlier trials'; a pruned trial's ranks are stopped (SIGTERM: they
checkpoint and exit). Several workers share one study: each claims a trial under a lock on the
study, so the study ends with exactly ``n_trials`` finished trials, and records a heartbeat while
it trains; a worker that dies leaves a trial whose heartbeat stops, which the next claim marks
failed and, with ``retry_failed``, runs again. MLflow: one parent run for the study, each trial's
training run nested under it.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainpipe.components.tune_model.spec import (
    BEST_FILE,
    NAME,
    REPORT_FILE,
    Param,
    TrialSummary,
    TuneModelConfig,
    TuneModelResult,
)
from trainpipe.contract.errors import InputError, ServiceUnavailable, TrainpipeError
from trainpipe.contract.io import atomic_write_json, atomic_write_settings, atomic_write_text
from trainpipe.contract.lineage import Lineage, TuningLineage
from trainpipe.contract.runtime import Runtime
from trainpipe.layout import EPOCH_METRICS_FILE, MODEL_FILE
from trainpipe.tabular import find_dataset
from trainpipe.tracking import PARENT_RUN_ENV

ROWS_FILE = "tuning_rows.parquet"


def storage_url(config: TuneModelConfig) -> str:
    return config.storage or f"sqlite:///{(Path(config.output_dir) / 'study.db').resolve()}"


def _redact(url: str) -> str:
    from trainpipe.tracking import redact

    return redact(url)


@contextlib.contextmanager
def study_lock(url: str) -> Iterator[None]:
    """One worker at a time claims a trial: a PostgreSQL advisory lock, or a file lock beside SQLite."""
    if url.startswith("sqlite:///"):
        import fcntl

        path = Path(url.removeprefix("sqlite:///") + ".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return
    if url.startswith(("postgresql", "postgres")):
        import sqlalchemy

        key = int(hashlib.sha256(url.encode()).hexdigest()[:15], 16)
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        return
    yield  # another database: claims may overshoot n_trials by a worker or two


def open_study(config: TuneModelConfig) -> Any:
    """Create the study, or load the one the other workers share (its directions must match)."""
    import warnings

    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    # heartbeats with ask/tell, and fail_stale_trials, are Optuna's "experimental" parts used as designed here
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    url = storage_url(config)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=config.pruner_warmup_epochs)
        if config.pruner == "median"
        else optuna.pruners.NopPruner()
    )
    sampler = optuna.samplers.TPESampler(seed=config.seed + config.worker, n_startup_trials=4)
    directions = [o.resolved() for o in config.objectives]
    retry = RetryHeartbeatStaleTrialCallback(max_retry=config.retry_failed) if config.retry_failed else None
    with study_lock(url):  # the first worker creates the tables and the study; the others wait, then load them
        try:
            storage = RDBStorage(
                url,
                heartbeat_interval=max(1, config.stale_after_s // 3),
                grace_period=config.stale_after_s,
                heartbeat_stale_trial_callback=retry,
            )
        except Exception as exc:
            from trainpipe.tracking import first_line

            raise ServiceUnavailable(f"storage: cannot open {_redact(url)}: {first_line(exc)}") from None
        try:
            study = optuna.create_study(
                storage=storage,
                study_name=config.study_name,
                directions=directions,
                sampler=sampler,
                pruner=pruner,
                load_if_exists=True,
            )
        except ValueError as exc:
            raise InputError(f"objectives: {exc}") from None
    if [d.name.lower() for d in study.directions] != directions:
        raise InputError(
            f"objectives: study {config.study_name!r} in {_redact(url)} was made with directions "
            f"{[d.name.lower() for d in study.directions]}, not {directions}"
        )
    return study


def tuning_rows(config: TuneModelConfig, out: Path) -> Path:
    """The training side of the snapshot's split (as the final training will split it), written once:
    the rows evaluate_model holds out never reach a trial."""
    import pandas as pd

    from trainpipe.tabular import held_out, iter_chunks

    path = out / ROWS_FILE
    if path.is_file():
        return path
    source = find_dataset(config.data, "data")
    frac = float(config.train.get("test_fraction", 0.2))
    seed = int(config.train.get("seed", 0))
    parts = []
    for first, df in iter_chunks(str(source), None):
        import numpy as np

        keep = ~held_out(np.arange(first, first + len(df)), frac, seed)
        parts.append(df.loc[keep])
    frame = pd.concat(parts, ignore_index=True)
    if config.label_column not in frame.columns:
        raise InputError(f"label_column: {config.label_column!r} is not a column of the data")
    tmp = path.with_suffix(".tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return path


def sample(trial: Any, space: dict[str, Param]) -> dict[str, Any]:
    """The trial's parameters, conditions honoured (a parameter is sampled once those it depends on are)."""
    chosen: dict[str, Any] = {}
    pending = dict(space)
    while pending:
        ready = [n for n, p in pending.items() if all(d in chosen or d not in pending for d in p.when)]
        if not ready:
            break
        for name in ready:
            p = pending.pop(name)
            if any(chosen.get(d, object()) != v for d, v in p.when.items()):
                continue  # its condition is not met in this trial
            chosen[name] = _suggest(trial, name, p)
    return chosen


def _plain(choices: list[Any]) -> list[Any]:
    """Optuna stores a categorical choice as a number, a string or None: a list or a mapping goes as its JSON."""
    return [json.dumps(c) if isinstance(c, (list, dict)) else c for c in choices]


def decode(space: dict[str, Param], params: dict[str, Any]) -> dict[str, Any]:
    """A trial's parameters as the space wrote them (a list choice is a list again)."""
    out = {}
    for name, value in params.items():
        p = space.get(name)
        if p is not None and p.choices is not None and value in _plain(p.choices):
            value = p.choices[_plain(p.choices).index(value)]
        out[name] = value
    return out


def _suggest(trial: Any, name: str, p: Param) -> Any:
    if p.type == "categorical":
        assert p.choices is not None
        return decode({name: p}, {name: trial.suggest_categorical(name, _plain(p.choices))})[name]
    assert p.low is not None and p.high is not None
    if p.type == "int":
        return trial.suggest_int(name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log)


def trial_settings(config: TuneModelConfig, params: dict[str, Any]) -> dict[str, Any]:
    """train_model's settings for a trial: ``train``, then the sampled parameters (train_config keys merged)."""
    settings = copy.deepcopy(config.train)
    train_config = dict(settings.get("train_config") or {})
    for name, value in params.items():
        if name.startswith("train_config."):
            train_config[name.removeprefix("train_config.")] = value
        else:
            settings[name] = value
    if train_config:
        settings["train_config"] = train_config
    return settings


def parameter_count(model_dir: Path) -> int:
    """Values in the model's weights, read from the safetensors header (no framework needed)."""
    import math
    import struct

    path = model_dir / MODEL_FILE
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")


class _Heartbeat(threading.Thread):
    """Tells the storage this trial's worker is alive, until stopped."""

    def __init__(self, storage: Any, trial_id: int, every: float) -> None:
        super().__init__(name="trainpipe-heartbeat", daemon=True)
        self.storage, self.trial_id, self.every = storage, trial_id, every
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                self.storage.record_heartbeat(self.trial_id)
            self.stop.wait(self.every)


class TrialRun:
    """One trial: its training as a subprocess, its curve reported for pruning, its score on the validation rows."""

    def __init__(self, config: TuneModelConfig, rows: Path, parent: str, lineage: Lineage, runtime: Runtime) -> None:
        self.config, self.rows, self.parent, self.lineage, self.runtime = config, rows, parent, lineage, runtime

    def command(self, trial: Any, settings: dict[str, Any], out: Path) -> list[str]:
        from trainpipe.training.launch import GUARD

        c = self.config
        full = {
            **settings,
            "data": str(self.rows),
            "output_dir": str(out),
            "test_fraction": c.validation_fraction,
            "seed": c.seed,
            "label_column": c.label_column,
            "experiment_name": c.experiment_name,
            **({"tracking_uri": c.tracking_uri} if c.tracking_uri else {}),
        }
        atomic_write_settings(out.with_suffix(".json"), full)
        orch = self.lineage.orchestrator
        run_id = f"{orch.run_id if orch and orch.run_id else 'study'}:{c.study_name}:trial-{trial.number}"
        entry = [sys.executable, "-m", "trainpipe.components.train_model", "--config", str(out.with_suffix(".json"))]
        return [sys.executable, "-c", GUARD, *entry, "--orchestrator", NAME, "--run-id", run_id]

    def __call__(self, trial: Any) -> list[float]:
        import optuna

        from trainpipe.training.launch import PARENT_ENV

        c = self.config
        params = sample(trial, c.space)
        settings = trial_settings(c, params)
        trial.set_user_attr("settings", settings)
        out = Path(c.output_dir) / "trials" / f"trial-{trial.number:04d}"
        out.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, PARENT_ENV: str(os.getpid()), **({PARENT_RUN_ENV: self.parent} if self.parent else {})}
        proc = subprocess.Popen(
            self.command(trial, settings, out),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        pruned = self._follow(trial, proc, out)
        stdout, _ = proc.communicate()
        if pruned:
            raise optuna.TrialPruned(f"trial {trial.number} pruned at epoch {pruned}")
        if proc.returncode != 0:
            raise TrialFailed(f"trial {trial.number}: train_model exited {proc.returncode}: {self._last_error}")
        result = json.loads(stdout.strip().splitlines()[-1])
        trial.set_user_attr("mlflow_run_id", result.get("mlflow_run_id", ""))
        return self.score(trial, out)

    def _follow(self, trial: Any, proc: subprocess.Popen[str], out: Path) -> int:
        """Relay the training's log; report each epoch's metric (from the epoch history train_model keeps in
        its output, rewritten at every epoch's end) and stop the ranks when the pruner says so.

        Returns:
            The epoch the trial was pruned at, else 0.
        """
        assert proc.stderr is not None
        metric = self.config.objectives[0].metric
        single = len(self.config.objectives) == 1
        history, seen = out / EPOCH_METRICS_FILE, 0
        self._last_error = ""
        pruned = 0
        for line in proc.stderr:
            sys.stderr.write(line)
            if line.startswith("trainpipe train_model: error: "):
                self._last_error = line.removeprefix("trainpipe train_model: error: ").strip()
            if not single or pruned or not history.is_file():
                continue
            with contextlib.suppress(OSError, ValueError):
                epochs = [json.loads(x) for x in history.read_text(encoding="utf-8").splitlines() if x.strip()]
                for epoch, figures in enumerate(epochs[seen:], start=seen + 1):
                    seen = epoch
                    if isinstance(figures.get(metric), (int, float)):
                        trial.report(float(figures[metric]), epoch)
                        if trial.should_prune():
                            pruned = epoch
                            with contextlib.suppress(ProcessLookupError):
                                os.killpg(proc.pid, signal.SIGTERM)  # the ranks finish their step, checkpoint, exit
                            break
        return pruned

    def score(self, trial: Any, out: Path) -> list[float]:
        """The trial's objectives: its model on the validation rows (its own split of the tuning rows)."""
        from trainpipe.scoring import task_metrics
        from trainpipe.serving.package import load_artifact
        from trainpipe.splits import held_out_rows

        model = load_artifact(out, self.runtime)
        x, y, _ = held_out_rows(str(self.rows), model, self.config.label_column)
        metrics = task_metrics(model, x, y)
        metrics["parameters"] = float(parameter_count(out))
        trial.set_user_attr("metrics", metrics)
        values = []
        for objective in self.config.objectives:
            if objective.metric not in metrics:
                have = ", ".join(sorted(metrics))
                raise InputError(f"objectives: {objective.metric!r} is not a metric of this task (it has {have})")
            values.append(float(metrics[objective.metric]))
        return values


class TrialFailed(TrainpipeError):
    """A trial's training failed (its sampled settings, or its code): the trial is failed, the study goes on."""


def search(study: Any, config: TuneModelConfig, run: TrialRun) -> int:
    """Claim and run trials until the study has ``n_trials`` finished ones. Returns how many ran here."""
    import optuna
    from optuna.trial import TrialState

    url = storage_url(config)
    ran = 0
    while True:
        with study_lock(url):
            optuna.storages.fail_stale_trials(study)
            trials = study.get_trials(deepcopy=False)
            finished = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
            waiting = sum(t.state == TrialState.WAITING for t in trials)
            running = sum(t.state == TrialState.RUNNING for t in trials)
            trial = None
            if finished >= config.n_trials:
                return ran
            if waiting or finished + running < config.n_trials:
                trial = study.ask()
        if trial is None:  # the other workers hold the last trials: wait for them (or for their heartbeat to stop)
            time.sleep(max(1.0, config.stale_after_s / 6))
            continue
        ran += 1
        beat = _Heartbeat(study._storage, trial._trial_id, max(1, config.stale_after_s // 3))
        beat.start()
        try:
            values = run(trial)
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
        except TrialFailed as exc:
            print(f"{NAME}: {exc}", file=sys.stderr, flush=True)
            study.tell(trial, state=TrialState.FAIL)
        except BaseException:
            study.tell(trial, state=TrialState.FAIL)
            raise
        else:
            study.tell(trial, values)
        finally:
            beat.stop.set()
        print(f"{NAME}: trial {trial.number} {study.trials[trial.number].state.name.lower()}", file=sys.stderr)


def tune_model(config: TuneModelConfig, lineage: Lineage, runtime: Runtime | None = None) -> TuneModelResult:
    """Run trials of the shared study until it has ``n_trials`` finished ones; then, with ``summarize``, summarize it.

    Args:
        config: The search space, the objectives, the study and its storage.
        lineage: The snapshot's lineage; ``tuning`` is added.
        runtime: The platform's settings (the tracking server is checked against its policy).

    Returns:
        The study's counts, its best trial (or Pareto front) and the best trial's train_model settings.

    Raises:
        InputError: a search space or objective that does not fit the data or the study.
        ServiceUnavailable: the study's storage or MLflow cannot be reached.
    """
    runtime = runtime or Runtime()
    lineage = Lineage.of(lineage)
    if config.study_name is None:
        config = config.model_copy(update={"study_name": study_name_for(lineage)})
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    study = open_study(config)
    parent = parent_run(study, config, runtime)
    rows = tuning_rows(config, out)
    ran = search(study, config, TrialRun(config, rows, parent, lineage, runtime))
    if not config.summarize:
        return summarize(study, config, ran, parent, lineage, out, write=False)
    wait_for_running(study, config)
    return summarize(study, config, ran, parent, lineage, out, write=True)


def study_name_for(lineage: Lineage) -> str:
    """``trainpipe-<run id>``: the workers of one orchestrator run share a study, the next run starts its own."""
    run = lineage.orchestrator.run_id if lineage.orchestrator and lineage.orchestrator.run_id else ""
    return f"trainpipe-{re.sub(r'[^A-Za-z0-9_.-]', '_', run)}"[:128] if run else "trainpipe"


def parent_run(study: Any, config: TuneModelConfig, runtime: Runtime) -> str:
    """The study's MLflow run, which every trial's training run is nested under: made by the first
    worker, found by the others in the study's own attributes."""
    from trainpipe import tracking

    with study_lock(storage_url(config)):
        known = study.user_attrs.get("mlflow_parent_run_id")
        if known:
            return str(known)
        try:
            client = tracking.connect(config.tracking_uri, runtime.policy)
            uri = tracking.resolve_tracking_uri(config.tracking_uri, runtime.policy)
            exp = tracking.ensure_experiment(client, config.experiment_name, uri)
            run = client.create_run(
                exp,
                tags={
                    "mlflow.runName": f"study-{config.study_name}",
                    "trainpipe.component": NAME,
                    "trainpipe.study": config.study_name,
                    "trainpipe.storage": _redact(storage_url(config)),
                },
            )
            from mlflow.entities import Param as MlflowParam

            client.log_batch(
                run.info.run_id,
                params=[
                    MlflowParam(
                        "space",
                        json.dumps({k: v.model_dump(exclude_defaults=True) for k, v in config.space.items()})[:6000],
                    ),
                    MlflowParam("objectives", ",".join(f"{o.metric}:{o.resolved()}" for o in config.objectives)),
                    MlflowParam("n_trials", str(config.n_trials)),
                ],
            )
        except TrainpipeError:
            raise
        except Exception as exc:
            raise tracking.classify(exc, "tracking_uri: opening the study's run", "failed") from None
        study.set_user_attr("mlflow_parent_run_id", run.info.run_id)
        return str(run.info.run_id)


def summarize(
    study: Any, config: TuneModelConfig, ran: int, parent: str, lineage: Lineage, out: Path, write: bool
) -> TuneModelResult:
    """The result; with ``write``, the best settings, the HTML report and the parent run's figures too."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    count = {s: sum(t.state == s for t in trials) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    objectives = [o.metric for o in config.objectives]
    result = TuneModelResult(
        study_name=config.study_name,
        storage=_redact(storage_url(config)),
        objectives=objectives,
        directions=[o.resolved() for o in config.objectives],
        ran_here=ran,
        complete=count[TrialState.COMPLETE],
        pruned=count[TrialState.PRUNED],
        failed=count[TrialState.FAIL],
        mlflow_parent_run_id=parent or None,
    )
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete:
        front = study.best_trials
        best = front[0] if len(objectives) == 1 else min(front, key=lambda t: t.number)
        result.best_trial, result.best_values = best.number, list(best.values)
        result.best_params = decode(config.space, best.params)
        result.best_settings = {**best.user_attrs.get("settings", {})}
        for key in ("test_fraction", "seed"):  # the final training splits as the study did
            if key in config.train:
                result.best_settings[key] = config.train[key]
        result.pareto_front = [
            TrialSummary(
                number=t.number,
                state=t.state.name,
                values=list(t.values),
                params=decode(config.space, t.params),
                mlflow_run_id=t.user_attrs.get("mlflow_run_id"),
            )
            for t in sorted(front, key=lambda t: t.number)
        ]
        result.lineage = lineage.with_(
            tuning=TuningLineage(
                study_name=config.study_name,
                storage=result.storage,
                objectives=objectives,
                finished_trials=result.complete + result.pruned,
                best_trial=best.number,
                best_values=list(best.values),
                mlflow_parent_run_id=parent or None,
            )
        )
    elif write:
        raise TrainpipeError(
            f"study {config.study_name}: no trial completed ({result.pruned} pruned, {result.failed} failed); "
            "see the trials' lines above"
        )
    if write:
        atomic_write_json(out / BEST_FILE, result.best_settings)
        from trainpipe.components.tune_model.report import write_report

        atomic_write_text(out / REPORT_FILE, write_report(study, config, result))
        result.report_file = REPORT_FILE
        _log_to_parent(config, parent, result, out)
    return result


def _log_to_parent(config: TuneModelConfig, parent: str, result: TuneModelResult, out: Path) -> None:
    from trainpipe import tracking

    if not parent:
        return
    try:
        client = tracking.connect(config.tracking_uri)
        for name, value in zip(result.objectives, result.best_values, strict=False):
            client.log_metric(parent, f"best_{name}", value)
        for key, value in (("complete", result.complete), ("pruned", result.pruned), ("failed", result.failed)):
            client.log_metric(parent, f"trials_{key}", value)
        client.set_tag(parent, "trainpipe.best_trial", str(result.best_trial))
        client.set_tag(parent, "trainpipe.best_params", json.dumps(result.best_params, sort_keys=True)[:5000])
        client.log_artifact(parent, str(out / REPORT_FILE), artifact_path=NAME)
        client.log_artifact(parent, str(out / BEST_FILE), artifact_path=NAME)
        client.set_terminated(parent, status="FINISHED")
    except Exception as exc:
        raise tracking.classify(exc, "tracking_uri: logging the study's result", "failed") from None


def wait_for_running(study: Any, config: TuneModelConfig) -> None:
    """The report step's fan-in: no trial is left running (a dead worker's trial is failed once stale)."""
    import optuna
    from optuna.trial import TrialState

    while True:
        with study_lock(storage_url(config)):
            optuna.storages.fail_stale_trials(study)
            busy = [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.RUNNING,)]
        if not busy:
            return
        time.sleep(max(1.0, config.stale_after_s / 6))
