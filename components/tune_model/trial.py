"""tune_model's trials: sampling the settings, one trial's train_model run (a subprocess, its heartbeat,
the pruner's judge, its stop), and the search loop that claims and runs them. optuna and mlflow are imported
inside the functions."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainpipe.components.tune_model.spec import (
    NAME,
    RUN_OBJECTIVES,
    SCORED,
    SIZE_OBJECTIVES,
    VALIDATION_METRICS,
    Param,
    TuneModelConfig,
    with_params,
)
from trainpipe.components.tune_model.study import storage_url, study_lock, trial_dir
from trainpipe.contract.errors import (
    EXIT_TRANSIENT,
    BudgetReached,
    InputError,
    Preempted,
    TrainpipeError,
)
from trainpipe.contract.io import atomic_write_settings
from trainpipe.contract.layout import EPOCH_METRICS_FILE, MODEL_FILE
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.push import TRY_ENV
from trainpipe.contract.result import ErrorRecord
from trainpipe.contract.runtime import Runtime
from trainpipe.services.tracking import PARENT_RUN_ENV, RUN_NAME_ENV
from trainpipe.training.metrics import diverged

#: A trial's user attribute: it trains the train section as given (trial 0, the baseline).
BASELINE_ATTR = "baseline"
#: A failed trial's user attribute: why the study failed it (its loss diverged, its training failed).
FAILURE_ATTR = "failure"


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
    return with_params(config.train, params)


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


def error_record_path(out: Path) -> Path:
    """Where a trial's train_model writes its error record when it fails: beside its output folder."""
    return out.with_suffix(".error.json")


class Stop:
    """A signal asking this worker to stop (SIGTERM: the platform; SIGINT: Ctrl-C): the running trial's training
    gets SIGTERM, as the platform stops one (its ranks checkpoint at their step's end, its MLflow run ends
    KILLED), no trial starts after it, and the study's run ends (:func:`tune_model`)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.proc: subprocess.Popen[str] | None = None  # the running trial's training
        self.event = threading.Event()

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        if self.signum is None:
            self.signum = signum
            print(f"{NAME}: {signal.Signals(signum).name} received: stopping the running trial", file=sys.stderr)
        self.event.set()
        self.forward()

    def forward(self) -> None:
        """Stop the running trial's training (its own session: train_model and what it started)."""
        proc = self.proc
        if self.signum is not None and proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stop]:
        """Catch the signals while the study runs (the main thread only can)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self.on_signal) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def wait(self, seconds: float) -> None:
        """Sleep, unless a signal asks to stop (then raise at once)."""
        self.event.wait(seconds)
        self.check()

    def check(self, during: str = "") -> None:
        """Raises what the signal means: KeyboardInterrupt for SIGINT (exit 130), Preempted for SIGTERM (75)."""
        if self.signum is None:
            return
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Preempted(
            f"stopped by SIGTERM{during}: a retry of this run (or, by hand, resume: true) continues the study"
        )


class _Judge(threading.Thread):
    """The trial's side of its training's epoch gate (:data:`~trainpipe.training.control.EPOCH_GATE_ENV`): the
    training's chief sends each epoch's line and waits for the answer, so a trial stops at the epoch the study
    decided on (pruned, or missing what it must log), not an epoch later."""

    def __init__(self, decide: Any) -> None:
        import socket
        import tempfile

        super().__init__(name="trainpipe-epoch-judge", daemon=True)
        self.decide = decide
        self.folder = tempfile.mkdtemp(prefix="trainpipe-gate-")  # short: a socket's path is at most 107 bytes
        self.path = os.path.join(self.folder, "gate")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(1)
        self.conn: socket.socket | None = None

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()  # one training at a time (a retried attempt connects again)
            except OSError:
                return  # closed: the trial is over
            self.conn = conn
            with conn, conn.makefile("rb") as lines:
                for line in lines:
                    try:
                        stop = bool(self.decide(json.loads(line)))
                    except Exception as exc:  # noqa: BLE001 (a storage error must not hold the training)
                        print(f"{NAME}: warning: judging an epoch: {type(exc).__name__}: {exc}", file=sys.stderr)
                        stop = False
                    try:
                        conn.sendall(b"s" if stop else b"c")
                    except OSError:
                        break

    def close(self) -> None:
        import shutil
        import socket

        for sock in (self.sock, self.conn):  # wakes accept(), ends a conversation (the training goes on unasked)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.join(timeout=5)
        shutil.rmtree(self.folder, ignore_errors=True)


class TrialRun:
    """One trial: its training as a subprocess, its curve reported for pruning, its score on the validation rows."""

    def __init__(self, config: TuneModelConfig, rows: Path, parent: str, lineage: Lineage, runtime: Runtime) -> None:
        self.config, self.rows, self.parent, self.lineage, self.runtime = config, rows, parent, lineage, runtime
        self.stop = Stop()
        self._bad: InputError | None = None
        self._pruned: dict[str, int] | None = None
        self._diverged: str | None = None  # why the trial failed at an epoch's end: a loss NaN or infinite
        self._checked = False
        self._reported = 0

    def run_id(self, number: int) -> str:
        """The orchestrator run id a trial's training records (its MLflow run is found by it)."""
        orch = self.lineage.orchestrator
        return f"{orch.run_id if orch and orch.run_id else 'study'}:{self.config.study_name}:trial-{number}"

    def command(self, trial: Any, settings: dict[str, Any], out: Path) -> list[str]:
        from trainpipe.contract.lifeline import guarded

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
        run_id = self.run_id(trial.number)
        entry = [sys.executable, "-m", "trainpipe.components.train_model", "--config", str(out.with_suffix(".json"))]
        record = ["--error-record", str(error_record_path(out))]
        # it is killed when this worker dies (SIGKILL: nobody is left to read it): within a moment, whatever it was
        # doing, starting up included, and it opens no MLflow run afterwards; the study fails the trial once its
        # heartbeat is stale and ends its run. A stop (Stop) is what asks it to checkpoint and end its run KILLED.
        return guarded([*entry, "--orchestrator", NAME, "--run-id", run_id, *record], signal.SIGKILL)

    def __call__(self, trial: Any) -> list[float]:
        c = self.config
        baseline = bool(trial.user_attrs.get(BASELINE_ATTR))
        params = {} if baseline else sample(trial, c.space)
        settings = trial_settings(c, params)
        trial.set_user_attr("settings", settings)
        if baseline:
            trial.set_user_attr("params", baseline_params(c))
        out = trial_dir(c, trial.number)
        out.parent.mkdir(parents=True, exist_ok=True)
        self._bad, self._pruned, self._diverged, self._checked, self._reported = None, None, None, False, 0
        try:
            stdout = self._train(trial, settings, out, baseline)
            result = json.loads(stdout.strip().splitlines()[-1])
            trial.set_user_attr("mlflow_run_id", result.get("mlflow_run_id", ""))
            if result.get("diverged_at_epoch") is not None:  # its loss went NaN or infinite where no judge was asked
                raise TrialFailed(f"trial {trial.number}: its loss diverged at epoch {result['diverged_at_epoch']}")
            values = self.score(trial, out, result)
        except BaseException as exc:  # its training's run ends too, whatever ended the trial, as the study records it
            import optuna

            stopped = isinstance(exc, optuna.TrialPruned | Preempted | KeyboardInterrupt)  # pruned, or stopped
            # a failed trial's run says FAILED and why, even where its training had ended it otherwise
            reason = None if stopped else str(exc) or type(exc).__name__
            if isinstance(exc, TrialFailed):
                trial.set_user_attr(FAILURE_ATTR, str(exc)[:2000])
            close_runs(
                self.config,
                self.parent,
                {trial.number: trial_run_name(trial)},
                "KILLED" if stopped else "FAILED",
                reason,
            )
            raise
        self.log_trial(trial, result.get("mlflow_run_id", ""), params, settings)
        return values

    def _train(self, trial: Any, settings: dict[str, Any], out: Path, baseline: bool) -> str:
        """Run the trial's training (once more after an exit 75) while a judge answers it at each epoch's end.

        Returns:
            Its stdout (the result's line last).

        Raises:
            optuna.TrialPruned: the pruner stopped it (at the epoch it decided on).
            InputError: it does not log what the study must read.
            TrialFailed: it failed.
        """
        import optuna

        from trainpipe.contract.lifeline import PARENT_ENV
        from trainpipe.training.control import EPOCH_GATE_ENV

        judge = _Judge(lambda line: self.judge(trial, line))
        judge.start()
        env = {
            **os.environ,
            PARENT_ENV: str(os.getpid()),
            EPOCH_GATE_ENV: judge.path,
            RUN_NAME_ENV: f"trial-{trial.number}" + (" (baseline)" if baseline else ""),
            **({PARENT_RUN_ENV: self.parent} if self.parent else {}),
        }
        try:
            for attempt in (1, 2):
                self.stop.check(f" before trial {trial.number} started")
                error_record_path(out).unlink(missing_ok=True)
                proc = subprocess.Popen(
                    self.command(trial, settings, out),
                    env={**env, TRY_ENV: str(attempt)},  # a retry, as an orchestrator's: its figures and faults say so
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
                self.stop.proc = proc
                self.stop.forward()  # a signal that came while it started
                self._relay(proc)
                stdout, _ = proc.communicate()
                self.stop.proc = None
                if self._bad is not None:
                    raise self._bad
                if self._diverged is not None:
                    raise TrialFailed(self._diverged)
                if self._pruned is not None:
                    epoch, step = self._pruned["epoch"], self._pruned["step"]
                    raise optuna.TrialPruned(f"trial {trial.number} pruned at epoch {epoch} (step {step})")
                if proc.returncode == 0:
                    return stdout  # a signal that came as it ended stops the study before the next trial
                self.stop.check(f" during trial {trial.number} (its training stopped at its step's end)")
                # what train_model said, from its error record (never its log); none when it was killed
                why = ErrorRecord.explain("train_model", proc.returncode, error_record_path(out))
                if proc.returncode == EXIT_TRANSIENT and attempt == 1:  # a service answered late, or a preemption
                    print(
                        f"{NAME}: trial {trial.number}: train_model exited 75 ({why}): trying it again", file=sys.stderr
                    )
                    continue  # its checkpoints, where it wrote any, resume it
                raise TrialFailed(f"trial {trial.number}: train_model exited {proc.returncode}: {why}")
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            judge.close()

    def _relay(self, proc: subprocess.Popen[str]) -> None:
        """Copy the training's log to ours until it ends; once the study stopped it (pruned, or missing what it
        must log), what it says while it stops is not the study's news: the study says why in one line."""
        assert proc.stderr is not None
        for line in proc.stderr:
            if self._pruned is None and self._bad is None and self._diverged is None:
                sys.stderr.write(line)

    def judge(self, trial: Any, line: dict[str, Any]) -> bool:
        """An epoch's end, its chief waiting (its line: the epoch's means): whether the trial stops here. At the
        first, an objective the study must read that the function did not log stops it (the study's one-line
        error); when the study prunes, the first objective is reported and the pruner decides."""
        if self._bad is not None or self._pruned is not None or self._diverged is not None:
            return True
        objective = self.config.objectives[0].metric
        pruning = len(self.config.objectives) == 1 and self.config.pruner != "none"
        if not self._checked:
            self._checked = True
            self._bad = self.unreported(line, pruning)
            if self._bad is not None:
                return True
        epoch = int(line.get("epoch", 0)) + 1
        gone = {
            **diverged(line),
            **{o.metric: v for o in self.config.objectives if _not_finite(v := line.get(o.metric))},
        }
        if gone:  # a loss or an objective NaN or infinite: the trial fails here, with why (never pruned on it)
            shown = ", ".join(f"{k} {v}" for k, v in sorted(gone.items()))
            self._diverged = (
                f"trial {trial.number}: its loss diverged at epoch {epoch} (step {line.get('step', 0)}): {shown}"
            )
            trial.set_user_attr("diverged_at", {"epoch": epoch, "step": int(line.get("step", 0))})
            return True
        value = line.get(objective)
        if not pruning or epoch <= self._reported or not isinstance(value, int | float):
            return False
        self._reported = epoch  # a resumed attempt reports only the epochs after those reported
        trial.report(float(value), epoch)
        if not trial.should_prune():
            return False
        self._pruned = {"epoch": epoch, "step": int(line.get("step", 0))}
        trial.set_user_attr("pruned_at", self._pruned)
        return True

    def unreported(self, first_epoch: dict[str, Any], pruning: bool) -> InputError | None:
        """At the first epoch's end: an objective the function must log (or the pruner's, when it prunes)
        that it did not, as the study's one-line error; None when every one is there."""
        c = self.config
        needed = [o for i, o in enumerate(c.objectives) if not o.scored() or (i == 0 and pruning)]
        missing = [o.metric for o in needed if not isinstance(first_epoch.get(o.metric), (int, float))]
        if not missing:
            return None
        logged = sorted(k for k in first_epoch if k not in ("epoch", "step")) or ["nothing"]
        function = c.train.get("train_function", "builtin:mlp")
        scored = [m for m in missing if m in SCORED]
        hint = (
            f"; set pruner: none to score {', '.join(scored)} on the validation rows without pruning" if scored else ""
        )
        return InputError(
            f"objectives: {function} logs {', '.join(logged)} each epoch, not {', '.join(map(repr, missing))}: "
            f"name one of those as the metric (with its direction){hint}"
        )

    def log_trial(self, trial: Any, run_id: str, params: dict[str, Any], settings: dict[str, Any]) -> None:
        """The trial's own MLflow run carries its number, what was sampled and its scores (never fails a trial)."""
        if not run_id:
            return
        from trainpipe.services import tracking

        try:
            from mlflow.entities import Metric, RunTag

            client = tracking.connect(self.config.tracking_uri)
            now = int(time.time() * 1000)
            sampled = trial.user_attrs.get("params") or params
            client.log_batch(  # one request: a study pays it once a trial
                run_id,
                metrics=[Metric(k, v, now, 0) for k, v in run_metrics(trial.user_attrs.get("metrics", {})).items()],
                tags=[
                    RunTag("trainpipe.trial", str(trial.number)),
                    RunTag("trainpipe.baseline", str(bool(trial.user_attrs.get(BASELINE_ATTR))).lower()),
                    RunTag("trainpipe.trial_params", json.dumps(sampled)[:5000]),
                ],
            )
        except Exception as exc:  # noqa: BLE001 (the trial's training is logged already; this is its label)
            print(f"{NAME}: warning: labelling trial {trial.number}'s run: {type(exc).__name__}", file=sys.stderr)

    def score(self, trial: Any, out: Path, result: dict[str, Any]) -> list[float]:
        """The trial's objectives: its model on the validation rows (its own split of the tuning rows), what
        its training used and cost (train_model's result), and what the function logged (its last epoch's
        mean) for an objective that is not a validation metric."""
        from trainpipe.data.scoring import task_metrics
        from trainpipe.data.splits import held_out_rows
        from trainpipe.services.serving.package import load_artifact

        model = load_artifact(out, self.runtime)
        x, y, _ = held_out_rows(str(self.rows), model, self.config.label_column)
        try:
            metrics = task_metrics(model, x, y)
        except ValueError as exc:  # its weights gave NaN or infinite predictions (a loss it did not log diverged)
            raise TrialFailed(
                f"trial {trial.number}: its model cannot be scored on the validation rows: {exc}"
            ) from None
        metrics["parameters"] = float(parameter_count(out))
        used = result.get("usage") or {}
        metrics.update({k: float(used[k]) for k in RUN_OBJECTIVES if isinstance(used.get(k), (int, float))})
        if result.get("cost") is not None:
            metrics["cost"] = float(result["cost"])
            trial.set_user_attr("cost", float(result["cost"]))
            trial.set_user_attr("currency", str(result.get("currency") or ""))
        trial.set_user_attr("gpu_seconds", float(used.get("gpu_seconds", 0.0)))
        logged = _last_epoch(out)
        for objective in self.config.objectives:
            if not objective.scored() and isinstance(logged.get(objective.metric), (int, float)):
                metrics[objective.metric] = float(logged[objective.metric])
        trial.set_user_attr("metrics", metrics)
        values = []
        for objective in self.config.objectives:
            if objective.metric not in metrics:
                have = ", ".join(sorted(metrics))
                raise InputError(f"objectives: {objective.metric!r} is not a metric of this task (it has {have})")
            values.append(float(metrics[objective.metric]))
        gone = [f"{o.metric} {v}" for o, v in zip(self.config.objectives, values, strict=True) if _not_finite(v)]
        if gone:  # Optuna would fail it without saying why: the study says
            raise TrialFailed(f"trial {trial.number}: its objective is not a number: {', '.join(gone)}")
        return values


def _not_finite(value: Any) -> bool:
    import math

    return isinstance(value, float) and not math.isfinite(value)


def run_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """What a trial adds to its training's MLflow run: its model's scores on the validation rows
    (``val_accuracy``) and its size (``parameters``). What the function logged (``val_loss``) and what the
    training used and cost are on that run already, under train_model's names (``train_val_loss``,
    ``train_wall_seconds``): never again under a name of their own (``val_val_loss``)."""
    out = {}
    for name, value in metrics.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            continue
        if name in VALIDATION_METRICS:
            out[f"val_{name}"] = float(value)
        elif name in SIZE_OBJECTIVES:
            out[name] = float(value)
    return out


def _last_epoch(out: Path) -> dict[str, Any]:
    """The last epoch's line of a trial's training history (what its function logged), else empty."""
    try:
        lines = [x for x in (out / EPOCH_METRICS_FILE).read_text(encoding="utf-8").splitlines() if x.strip()]
    except OSError:
        return {}
    return json.loads(lines[-1]) if lines else {}


def baseline_params(config: TuneModelConfig) -> dict[str, Any]:
    """What the baseline trial trains with, dimension by dimension: the train section's value, else the
    setting's default (a train_config key the section leaves out: the function's own default)."""
    from trainpipe.training.config_types import config_model
    from trainpipe.training.settings import TrainModelParams

    train_config = config.train.get("train_config") or {}
    model = config_model(str(config.train.get("train_function", "builtin:mlp")))
    out: dict[str, Any] = {}
    for name in config.space:
        if name.startswith("train_config."):
            key = name.removeprefix("train_config.")
            field = model.model_fields.get(key) if model is not None else None
            default = (
                field.get_default(call_default_factory=True) if field is not None and not field.is_required() else None
            )
            out[name] = train_config.get(key, default if field is not None else "(the function's default)")
        else:
            field = TrainModelParams.model_fields[name]
            out[name] = config.train.get(name, field.get_default(call_default_factory=True))
    return out


class TrialFailed(TrainpipeError):
    """A trial's training failed (its sampled settings, or its code): the trial is failed, the study goes on."""


def search(study: Any, config: TuneModelConfig, run: TrialRun) -> int:
    """Claim and run trials until the study has ``n_trials`` finished ones. Returns how many ran here."""
    import optuna
    from optuna.trial import TrialState

    url = storage_url(config)
    ran = 0
    while True:
        run.stop.check()  # no trial starts once this worker is asked to stop
        with study_lock(url):
            fail_stale(study, config, run)
            trials = study.get_trials(deepcopy=False)
            finished = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
            waiting = sum(t.state == TrialState.WAITING for t in trials)
            running = sum(t.state == TrialState.RUNNING for t in trials)
            trial = None
            if finished >= config.n_trials or gave_up(trials, config, finished):
                return ran
            spent = study_spent(trials, config)
            if spent is not None:
                raise BudgetReached(
                    f"{spent}; {finished} of {config.n_trials} trials finished: a rerun with a larger "
                    "budget (resume: true) continues the same study"
                )
            if waiting or finished + running < config.n_trials:
                trial = study.ask()
                if config.baseline and not any(t.user_attrs.get(BASELINE_ATTR) for t in trials):
                    trial.set_user_attr(BASELINE_ATTR, True)  # the first trial of the study: train as given
        if trial is None:  # the other workers hold the last trials: wait for them (or for their heartbeat to stop)
            run.stop.wait(max(1.0, config.stale_after_s / 6))
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
            if trial.user_attrs.get(BASELINE_ATTR):  # the train section as given cannot train: no study can
                raise InputError(f"train: the baseline trial (the train section as given) failed: {exc}") from None
        except BaseException:
            study.tell(trial, state=TrialState.FAIL)
            raise
        else:
            study.tell(trial, values)
        finally:
            beat.stop.set()
        state = study.trials[trial.number].state.name.lower()
        where = trial.user_attrs.get("pruned_at") if state == "pruned" else None
        at = f" at epoch {where['epoch']} (step {where['step']}): its training stopped there" if where else ""
        print(f"{NAME}: trial {trial.number} {state}{at}", file=sys.stderr)


def gave_up(trials: list[Any], config: TuneModelConfig, finished: int) -> bool:
    """Whether as many trials failed (their training, a diverged loss; not a dead worker's) as the study was to
    finish: it ends then (a study that cannot finish, not one that trains forever), and says so."""
    from optuna.trial import TrialState

    failed = sum(t.state == TrialState.FAIL and bool(t.user_attrs.get(FAILURE_ATTR)) for t in trials)
    if failed < config.n_trials:
        return False
    print(
        f"{NAME}: {failed} trial{'' if failed == 1 else 's'} failed, as many as n_trials ({config.n_trials}): "
        f"no trial starts after them ({finished} finished)",
        file=sys.stderr,
    )
    return True


def study_spent(trials: list[Any], config: TuneModelConfig) -> str | None:
    """What the study's trials have spent against its budget, when the budget is reached; else None."""
    if config.max_cost is None and config.max_gpu_hours is None:
        return None
    costs = [t.user_attrs["cost"] for t in trials if isinstance(t.user_attrs.get("cost"), (int, float))]
    gpu_s = sum(t.user_attrs.get("gpu_seconds", 0.0) for t in trials)
    if config.max_cost is not None:
        currency = next((t.user_attrs["currency"] for t in trials if t.user_attrs.get("currency")), "")
        if sum(costs) >= config.max_cost:
            return (
                f"max_cost: the study's trials spent {sum(costs):.4f} {currency} of {config.max_cost:g} {currency} "
                f"({gpu_s:.0f} GPU-seconds)"
            ).replace("  ", " ")
    if config.max_gpu_hours is not None and gpu_s / 3600 >= config.max_gpu_hours:
        return f"max_gpu_hours: the study's trials held {gpu_s / 3600:.4f} GPU-hours of {config.max_gpu_hours:g}"
    return None


def fail_stale(study: Any, config: TuneModelConfig, run: TrialRun) -> None:
    """Fail the trials whose worker died (no heartbeat for ``stale_after_s``), and end their trainings' MLflow
    runs as FAILED: a dead worker's trial never stays RUNNING there."""
    import optuna
    from optuna.trial import TrialState

    before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    optuna.storages.fail_stale_trials(study)
    failed = [t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if t.number in before]
    if failed:
        close_runs(config, run.parent, {t.number: trial_run_name(t) for t in failed}, "FAILED")


def trial_run_name(trial: Any) -> str:
    """The MLflow run name of a trial's training (train_model names its run so)."""
    return f"trial-{trial.number}" + (" (baseline)" if trial.user_attrs.get(BASELINE_ATTR) else "")


def close_runs(
    config: TuneModelConfig, parent: str, trials: dict[int, str], status: str, reason: str | None = None
) -> None:
    """End the MLflow runs of these trials' trainings (number -> run name, under the study's run) that are
    still RUNNING, as ``status``; a trial whose training was killed before it opened its run gets one, ended
    so: every trial the study started has a run, and none stays RUNNING (never fails the study). With
    ``reason`` (a trial the study failed: its loss diverged, its training failed) the run ends ``status``
    whatever its training ended it as, and says why (``trainpipe.failure``): MLflow and the study agree."""
    from trainpipe.services import tracking

    if not parent:
        return
    try:
        client = tracking.connect(config.tracking_uri)
        exp_id = client.get_run(parent).info.experiment_id
        for number, name in trials.items():
            found = client.search_runs(
                [exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.`mlflow.runName` = '{name}'"
            )
            if not found:
                tags = {"mlflow.parentRunId": parent, "trainpipe.component": NAME, "trainpipe.study": config.study_name}
                found = [client.create_run(exp_id, run_name=name, tags=tags)]
            for r in found:
                client.set_tag(r.info.run_id, "trainpipe.trial", str(number))
                if reason:
                    client.set_tag(r.info.run_id, "trainpipe.failure", reason[:5000])
                if r.info.status == "RUNNING" or (reason and r.info.status != status):
                    client.set_terminated(r.info.run_id, status=status)
                    print(f"{NAME}: trial {number}'s MLflow run {r.info.run_id} ended {status}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001
        print(f"{NAME}: warning: ending trial runs in MLflow: {type(exc).__name__}: {exc}", file=sys.stderr)


def wait_for_running(study: Any, config: TuneModelConfig, run: TrialRun) -> None:
    """The report step's fan-in: no trial is left running (a dead worker's trial is failed once stale)."""
    from optuna.trial import TrialState

    while True:
        with study_lock(storage_url(config)):
            fail_stale(study, config, run)
            busy = [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.RUNNING,)]
        if not busy:
            return
        run.stop.wait(max(1.0, config.stale_after_s / 6))
