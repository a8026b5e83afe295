"""tune_model: the work. optuna, mlflow, pandas and plotly are imported inside the functions.

This module runs a study from end to end; each job has its module beside it: ``study`` (the storage, the lock,
the study's folders and rows, its parent run), ``trial`` (sampling, one trial's training, the search loop),
``summary`` (the best trial, the result, the report).

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

from pathlib import Path

from trainpipe.components.tune_model.spec import (
    BEST_FILE,
    REPORT_FILE,
    TuneModelConfig,
    TuneModelResult,
)
from trainpipe.components.tune_model.study import (
    open_study,
    parent_run,
    search_of,
    study_dir,
    study_name_for,
    tuning_rows,
)
from trainpipe.components.tune_model.summary import end_parent, summarize
from trainpipe.components.tune_model.trial import TrialRun, search, wait_for_running
from trainpipe.contract.errors import (
    BudgetReached,
    InputError,
    Preempted,
)
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime
from trainpipe.services.profiles import prices_of, profile_name


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
    runtime = trusting_its_function(runtime or Runtime(), config)
    lineage = Lineage.of(lineage)
    uses_cost = config.max_cost is not None or any(o.metric == "cost" for o in config.objectives)
    if uses_cost and prices_of(runtime.hardware_profile) is None:
        field = "max_cost" if config.max_cost is not None else "objectives"
        raise InputError(
            f"{field}: the hardware profile {profile_name(runtime.hardware_profile)!r} declares no prices, so no trial "
            "has a cost (give the profile prices:, or use gpu_seconds / max_gpu_hours)"
        )
    what = search_of(config, lineage)
    if config.study_name is None:
        config = config.model_copy(update={"study_name": study_name_for(lineage, what)})
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    clear_outputs(out)
    orch = lineage.orchestrator
    study = open_study(config, what, orch.run_id if orch and orch.run_id else "")
    parent = parent_run(study, config, runtime)
    rows = tuning_rows(config, study_dir(config))
    run = TrialRun(config, rows, parent, lineage, runtime)
    with run.stop.installed():
        try:
            ran = search(study, config, run)
            if not config.summarize:
                return summarize(study, config, ran, parent, lineage, out, write=False)
            wait_for_running(study, config, run)
            return summarize(study, config, ran, parent, lineage, out, write=True)
        except BaseException as exc:  # the study's run does not stay RUNNING after its last worker
            stopped = isinstance(exc, Preempted | BudgetReached | KeyboardInterrupt)
            end_parent(study, config, parent, "KILLED" if stopped else "FAILED")
            raise


def clear_outputs(out: Path) -> None:
    """An earlier study's best settings and report leave output_dir before this study runs (the best settings
    first): a study that fails leaves none presented as its own; one that ends writes its own (each atomically)."""
    for name in (BEST_FILE, REPORT_FILE):
        (out / name).unlink(missing_ok=True)


def trusting_its_function(runtime: Runtime, config: TuneModelConfig) -> Runtime:
    """The study scores the models of the function it was told to train: their code's package is trusted
    to rebuild them (beside what the platform and ``trusted_packages`` trust)."""
    import dataclasses

    function = str(config.train.get("train_function", "builtin:mlp"))
    package = "" if function.startswith("builtin:") else function.partition(":")[0].split(".")[0]
    if not package or runtime.trusts(package):
        return runtime
    return dataclasses.replace(runtime, trusted_code=(*runtime.trusted_code, package))
