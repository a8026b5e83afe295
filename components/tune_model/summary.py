"""tune_model's summary: the best trial chosen on the objectives, the baseline compared, the result and
its report written, the parent run logged and ended. optuna, mlflow and plotly are imported inside the
functions."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from trainpipe.components.tune_model.spec import (
    BEST_FILE,
    NAME,
    REPORT_FILE,
    TrialSummary,
    TuneModelConfig,
    TuneModelResult,
)
from trainpipe.components.tune_model.study import storage_url
from trainpipe.components.tune_model.trial import BASELINE_ATTR, decode
from trainpipe.contract.errors import (
    TrainpipeError,
)
from trainpipe.contract.io import atomic_write_settings, atomic_write_text
from trainpipe.contract.lineage import Lineage, TuningLineage
from trainpipe.contract.text import redact


def end_parent(study: Any, config: TuneModelConfig, parent: str, status: str) -> None:
    """End the study's MLflow run as ``status`` when this worker stops or fails and no trial of the study is
    running (another worker, or the step that summarizes, ends it otherwise; a run that continues the study
    runs it again). Never raises: the worker's own error is the news."""
    from optuna.trial import TrialState

    from trainpipe.services import tracking

    if not parent:
        return
    try:
        if study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            return
        client = tracking.connect(config.tracking_uri)
        if client.get_run(parent).info.status == "RUNNING":
            client.set_terminated(parent, status=status)
            print(f"{NAME}: the study's MLflow run {parent} ended {status}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001
        print(f"{NAME}: warning: ending the study's MLflow run: {type(exc).__name__}: {exc}", file=sys.stderr)


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
        storage=redact(storage_url(config)),
        objectives=objectives,
        directions=[o.resolved() for o in config.objectives],
        ran_here=ran,
        complete=count[TrialState.COMPLETE],
        pruned=count[TrialState.PRUNED],
        failed=count[TrialState.FAIL],
        mlflow_parent_run_id=parent or None,
    )
    costs = [t.user_attrs["cost"] for t in trials if isinstance(t.user_attrs.get("cost"), (int, float))]
    result.gpu_seconds = round(sum(t.user_attrs.get("gpu_seconds", 0.0) for t in trials), 3)
    if costs:
        result.cost = round(sum(costs), 6)
        result.currency = next((t.user_attrs["currency"] for t in trials if t.user_attrs.get("currency")), None)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete:
        front = study.best_trials
        best = choose(complete, result.directions)
        base = next((t for t in complete if t.user_attrs.get(BASELINE_ATTR)), None)
        result.adopted = base is None or (best.number != base.number and beats(best, base, result.directions[0]))
        if base is not None:
            result.baseline_trial, result.baseline_values = base.number, list(base.values)
        taken = best if result.adopted or base is None else base
        result.best_trial, result.best_values = best.number, list(best.values)
        result.best_params = best.user_attrs.get("params") or decode(config.space, best.params)
        result.best_settings = {**taken.user_attrs.get("settings", {})}
        for key in ("test_fraction", "seed"):  # the final training splits as the study did
            if key in config.train:
                result.best_settings[key] = config.train[key]
        result.pareto_front = [
            TrialSummary(
                number=t.number,
                state=t.state.name,
                values=list(t.values),
                params=t.user_attrs.get("params") or decode(config.space, t.params),
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
                baseline_values=result.baseline_values or None,
                adopted=result.adopted,
                cost=result.cost,
                currency=result.currency,
            )
        )
    elif write:
        raise TrainpipeError(
            f"study {config.study_name}: no trial completed ({result.pruned} pruned, {result.failed} failed); "
            "see the trials' lines above"
        )
    if write:
        atomic_write_settings(out / BEST_FILE, result.best_settings)  # the team's train_config in its own key order
        from trainpipe.components.tune_model.report import write_report

        atomic_write_text(out / REPORT_FILE, write_report(study, config, result))
        result.report_file = REPORT_FILE
        _log_to_parent(config, parent, result, out)
    return result


def choose(trials: list[Any], directions: list[str]) -> Any:
    """The trial a study takes: the best on its first objective; a tie goes to the next objective, and so on,
    then to the lower trial number. With several objectives it is on the Pareto front (no trial is as good on
    every objective and better on one), and of the front it is the trial that best meets the objective the
    pruner reads and the baseline is compared on: list the objectives by priority (the whole front is in the
    result, to take another).

    Args:
        trials: Complete trials (each with ``number`` and ``values``).
        directions: ``maximize`` or ``minimize``, one per objective.
    """

    def rank(trial: Any) -> tuple[float, ...]:
        signs = [-1.0 if d == "maximize" else 1.0 for d in directions]
        return (*(sign * float(v) for sign, v in zip(signs, trial.values, strict=True)), trial.number)

    return min(trials, key=rank)


def beats(trial: Any, baseline: Any, direction: str) -> bool:
    """Whether a trial is strictly better than the baseline on the study's first objective."""
    mine, theirs = trial.values[0], baseline.values[0]
    return mine > theirs if direction == "maximize" else mine < theirs


def _log_to_parent(config: TuneModelConfig, parent: str, result: TuneModelResult, out: Path) -> None:
    from trainpipe.services import tracking

    if not parent:
        return
    try:
        from mlflow.entities import Metric, RunTag

        client = tracking.connect(config.tracking_uri)
        metrics = {
            **{f"best_{n}": v for n, v in zip(result.objectives, result.best_values, strict=False)},
            **{f"baseline_{n}": v for n, v in zip(result.objectives, result.baseline_values, strict=False)},
            **{f"trials_{k}": getattr(result, k) for k in ("complete", "pruned", "failed")},
            "study_gpu_seconds": result.gpu_seconds,
            **({"study_cost": result.cost} if result.cost is not None else {}),
        }
        tags = {
            "trainpipe.adopted": str(result.adopted).lower(),
            **({"trainpipe.cost_currency": result.currency or ""} if result.cost is not None else {}),
            "trainpipe.best_trial": str(result.best_trial),
            "trainpipe.best_params": json.dumps(result.best_params, sort_keys=True)[:5000],
        }
        now = int(time.time() * 1000)
        client.log_batch(  # one request, as a trial's label: on a SQLite store each write is a transaction
            parent,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        client.log_artifact(parent, str(out / REPORT_FILE), artifact_path=NAME)
        client.log_artifact(parent, str(out / BEST_FILE), artifact_path=NAME)
        client.set_terminated(parent, status="FINISHED")
    except Exception as exc:
        raise tracking.classify(exc, "tracking_uri: logging the study's result", "failed") from None
