"""tune_model: typed config and result. Imports nothing heavy.

A search space maps a train_model setting (``batch_size``, ``precision``, ``backend``,
``nproc_per_node``, ...) or a key of its ``train_config`` (``train_config.learning_rate``) to a
distribution: a float or int range (``log`` for a log scale, ``step``), or categorical choices;
``when`` makes it conditional on another parameter's value.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import OUTPUT, SOURCE
from trainpipe.contract.layout import TUNED_SETTINGS_FILE
from trainpipe.contract.result import ComponentResult
from trainpipe.contract.runtime import TrustedPackages
from trainpipe.data.scoring import LOWER_IS_BETTER, TASK_METRICS
from trainpipe.training.settings import TrainModelParams

NAME = "tune_model"
REPORT_FILE = "report.html"
BEST_FILE = TUNED_SETTINGS_FILE
#: train_model settings a trial does not take from ``train`` or the search space: the study's own.
NOT_IN_TRAIN = ("tracking_uri", "experiment_name", "label_column", "node_rank", "rdzv_endpoint")
#: ...nor searched: in ``train`` these two describe the final training's split, whose held-out rows
#: the study never reads (a trial splits the rest with ``validation_fraction`` and ``seed``).
NOT_IN_SPACE = (*NOT_IN_TRAIN, "test_fraction", "seed")
#: Objectives besides the validation metrics: the model's size.
SIZE_OBJECTIVES = ("parameters",)
#: ...and what the trial's training used and cost (train_model's result; cost needs a priced hardware profile).
RUN_OBJECTIVES = ("cost", "gpu_seconds", "cpu_core_seconds", "wall_seconds")
#: What tune_model scores a trial on itself; any other objective is a value the training function logs.
#: The task's metrics, which tune_model scores each trial's model on the validation rows.
VALIDATION_METRICS = tuple(dict.fromkeys(m for names in TASK_METRICS.values() for m in names))
SCORED = (
    *VALIDATION_METRICS,
    *SIZE_OBJECTIVES,
    *RUN_OBJECTIVES,
)


def with_params(train: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """train_model's settings: ``train``, then the parameters over it (``train_config.<key>`` merged into its
    ``train_config``). A copy: ``train`` is left as it was."""
    settings = copy.deepcopy(train)
    train_config = dict(settings.get("train_config") or {})
    for name, value in params.items():
        if name.startswith("train_config."):
            train_config[name.removeprefix("train_config.")] = value
        else:
            settings[name] = value
    if train_config:
        settings["train_config"] = train_config
    return settings


class Param(StrictModel):
    """One dimension of the search space."""

    type: Literal["float", "int", "categorical"]
    low: float | None = Field(None, description="float, int: the lowest value")
    high: float | None = Field(None, description="float, int: the highest value")
    log: bool = Field(False, description="float, int: sample on a log scale")
    step: float | None = Field(None, gt=0, description="float, int: sample on this grid")
    choices: list[Any] | None = Field(None, description="categorical: the values (numbers, strings, lists)")
    when: dict[str, Any] = Field(
        default_factory=dict, description="sampled only when these other parameters have these values"
    )

    def check(self, name: str) -> None:
        """Raises ValueError (one line naming the parameter) for a range that is empty, inverted or constant."""
        where = f"space.{name}"
        if self.type == "categorical":
            if not self.choices:
                raise ValueError(f"{where}: categorical needs at least two choices")
            if len({repr(c) for c in self.choices}) < 2:
                raise ValueError(f"{where}: a search space over a constant ({self.choices[0]!r}); set it in train")
            return
        if self.low is None or self.high is None:
            raise ValueError(f"{where}: {self.type} needs low and high")
        if self.low > self.high:
            raise ValueError(f"{where}: the range is inverted (low {self.low} > high {self.high})")
        if self.low == self.high:
            raise ValueError(f"{where}: a search space over a constant ({self.low}); set it in train")
        if self.log and self.low <= 0:
            raise ValueError(f"{where}: a log scale needs low > 0")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError(f"{where}: int bounds must be whole numbers")

    def candidates(self) -> list[Any]:
        """The values that stand for this dimension when a space is checked: its choices, or its ends."""
        if self.type == "categorical":
            return list(self.choices or [])
        ends = [self.low, self.high]
        return [int(v) for v in ends] if self.type == "int" else ends  # type: ignore[arg-type]


class Objective(StrictModel):
    """What a trial is scored on: a metric of the task on the validation rows, the model's size, or a value
    the training function logs (``ctx.log(val_loss=...)``: its last epoch's mean), which the pruner also
    reads each epoch."""

    metric: str = Field(
        "accuracy",
        min_length=1,
        description="a validation metric (accuracy, f1_macro, rmse, ...), parameters (the model's size), what the "
        "trial's training cost or used (cost, gpu_seconds, cpu_core_seconds, wall_seconds), or a value the training "
        "function logs each epoch (e.g. val_loss)",
    )
    direction: Literal["maximize", "minimize"] | None = Field(
        None,
        description="default: minimize for log_loss, mae, rmse, parameters and what a trial cost or used, maximize "
        "for the other validation metrics; required for a value the function logs",
    )

    @model_validator(mode="after")
    def _check(self) -> Objective:
        if self.direction is None and not self.scored():
            raise ValueError(
                f"direction: {self.metric!r} is not a validation metric ({', '.join(SCORED)}), so trainpipe reads it "
                "from what the training function logs: say whether to minimize or maximize it"
            )
        return self

    def scored(self) -> bool:
        """Whether tune_model computes it (on the validation rows, or from the weights), not the function."""
        return self.metric in SCORED

    def resolved(self) -> str:
        if self.direction:
            return self.direction
        lower = (*LOWER_IS_BETTER, *SIZE_OBJECTIVES, *RUN_OBJECTIVES)
        return "minimize" if self.metric in lower else "maximize"


class TuneModelParams(StrictModel):
    """Settings of tune_model that are not artifacts."""

    space: dict[str, Param] = Field(
        ..., description="parameter -> distribution: train_model settings or train_config.<key>"
    )
    train: dict[str, Any] = Field(
        default_factory=dict, description="train_model settings every trial takes (epochs, train_function, ...)"
    )
    objectives: list[Objective] = Field(
        default_factory=lambda: [Objective()],
        min_length=1,
        max_length=4,
        description="one objective, or several for a Pareto front (e.g. accuracy and parameters)",
    )
    n_trials: int = Field(
        20, ge=1, le=10_000, description="finished (complete or pruned) trials the study ends with, over all workers"
    )
    max_cost: float | None = Field(
        None,
        gt=0,
        le=1e9,
        description="the study's budget: no trial starts once its trials have cost this much at the hardware "
        "profile's prices (exit 9; a rerun with a larger max_cost continues the same study). A trial's own limit is "
        "train's max_cost",
    )
    max_gpu_hours: float | None = Field(
        None, gt=0, le=1e7, description="the study's budget in GPU-hours its trials held, as max_cost"
    )
    summarize: bool = Field(
        True,
        description="summarize the study when no trial is left (best settings, Pareto front, HTML report); false for "
        "the parallel workers, whose join step reports",
    )
    storage: str | None = Field(
        None,
        description="the study's RDB URL: postgresql://... where several workers share it (default: SQLite in "
        "output_dir)",
    )
    study_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,128}$",
        description="default: trainpipe-<the orchestrator's run id> (the workers of one run share it), by hand "
        "trainpipe-<a hash of the search>; a study another run made is refused unless resume",
    )
    baseline: bool = Field(
        True,
        description="trial 0 trains the train section as given; the best trial's settings are taken only when they "
        "beat it (false: every trial is sampled)",
    )
    resume: bool = Field(
        False,
        description="continue the study named study_name though another run made it (the same search only: another "
        "space, function or data is refused)",
    )
    seed: int = Field(
        0,
        ge=0,
        le=2**31 - 1,
        description="the trials' split of the tuning rows into training and validation rows (each trial's train_model "
        "seed); the sampler's is sampler_seed",
    )
    sampler_seed: int = Field(
        0, ge=0, le=2**31 - 1, description="the sampler's seed (worker i uses sampler_seed + i), apart from the split's"
    )
    worker: int = Field(0, ge=0, le=1024, description="this worker's index among the parallel workers")
    pruner: Literal["median", "none"] | None = Field(
        None,
        description="median: stop a trial whose training curve is below the median of earlier trials'; default: "
        "median for one objective, none for several (Optuna prunes single-objective studies only)",
    )
    pruner_warmup_epochs: int = Field(1, ge=0, le=10_000, description="epochs a trial runs before it can be pruned")
    validation_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of the training rows each trial is scored on (never the held-out test rows)"
    )
    retry_failed: int = Field(
        1, ge=0, le=10, description="times a trial whose worker died is run again (0: the trial is skipped)"
    )
    stale_after_s: int = Field(
        60, ge=3, le=86_400, description="a running trial with no heartbeat for this long is failed (its worker died)"
    )
    label_column: str = Field("label", min_length=1, description="name of the label column")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    experiment_name: str = Field(
        "trainpipe-tuning", min_length=1, description="the MLflow experiment of the study's parent and trial runs"
    )
    trusted_packages: TrustedPackages

    @model_validator(mode="before")
    @classmethod
    def _default_pruner(cls, data: Any) -> Any:
        """The pruner unset: median where it can prune (one objective), none for a Pareto front."""
        if isinstance(data, dict) and data.get("pruner") is None:
            objectives = data.get("objectives")
            several = isinstance(objectives, (list, tuple)) and len(objectives) > 1
            data = {**data, "pruner": "none" if several else "median"}
        return data

    @model_validator(mode="after")
    def _check(self) -> TuneModelParams:
        if not self.space:
            raise ValueError("space: give at least one parameter to search")
        settings = TrainModelParams.model_fields
        for name, param in self.space.items():
            key = name.removeprefix("train_config.")
            if name.startswith("train_config."):
                if not key:
                    raise ValueError(f"space: {name!r} names no train_config key")
            elif name not in settings or name in NOT_IN_SPACE:
                raise ValueError(
                    f"space: {name!r} is not a train_model setting a trial can take (nor train_config.<key>)"
                )
            param.check(name)
            for other in param.when:
                if other not in self.space or other == name:
                    raise ValueError(f"space.{name}.when: {other!r} is not another parameter of the space")
        for name in self.train:
            if name not in settings or name in NOT_IN_TRAIN:
                raise ValueError(f"train: {name!r} is not a train_model setting a trial can take")
            if name in self.space:
                raise ValueError(f"train: {name!r} is also in space; set it in one of them")
        self._check_trials_fit()
        self._check_task_metrics()
        self._check_epoch_logs()
        if len(self.objectives) > 1 and self.pruner != "none":
            raise ValueError(
                "pruner: Optuna prunes single-objective studies only; leave it unset (or none) for several objectives"
            )
        if len({o.metric for o in self.objectives}) != len(self.objectives):
            raise ValueError("objectives: each metric once")
        return self

    def _check_task_metrics(self) -> None:
        """A validation metric of another task than the trials' (``r2`` for a classification) is refused here, not
        once the baseline trial has trained and its scores lack it."""
        if "task" in self.space:
            return
        task = self.train.get("task", TrainModelParams.model_fields["task"].default)
        have = TASK_METRICS.get(task) if isinstance(task, str) else None
        if have is None:
            return
        for objective in self.objectives:
            if objective.metric in VALIDATION_METRICS and objective.metric not in have:
                if "objectives" not in self.model_fields_set:
                    raise ValueError(
                        f"objectives: unset, and the default {objective.metric!r} is not a metric of a {task} task: "
                        f"name one of {', '.join(have)}"
                    )
                other = next(t for t, names in TASK_METRICS.items() if objective.metric in names)
                raise ValueError(
                    f"objectives: {objective.metric!r} is not a metric of a {task} task (it has {', '.join(have)}); "
                    f"set train.task: {other} to score {other}'s metrics"
                )

    def _check_epoch_logs(self) -> None:
        """What the training function logs each epoch, where it is known before it runs: an objective the
        study must read from its curve (the pruner's, the first objective when it prunes; one tune_model does
        not score) and that it never logs (log_loss, f1_macro, parameters, cost: scored once a trial ends) is
        refused here, not at the first trial's first epoch end. A built-in's logs are its task's; a team
        function's are its ``ctx.log`` keywords where its source names them for certain
        (:mod:`trainpipe.training.source_logs`), else its first epoch tells, when it runs."""
        from trainpipe.training import source_logs
        from trainpipe.training.builtin import EPOCH_LOGS

        function = self.train.get("train_function", TrainModelParams.model_fields["train_function"].default)
        task = self.train.get("task", TrainModelParams.model_fields["task"].default)
        if not isinstance(function, str):
            return
        if function.startswith("builtin:"):
            logs, of_task = EPOCH_LOGS.get(task), f" ({task})"
        else:
            logs, of_task = source_logs.epoch_logs(function), ""
        if logs is None:
            return
        pruning = len(self.objectives) == 1 and self.pruner != "none"
        for i, objective in enumerate(self.objectives):
            if objective.metric in logs or (objective.scored() and not (i == 0 and pruning)):
                continue
            said = f"objectives: {function} logs {', '.join(logs) or 'nothing'} each epoch{of_task}"
            said += f", not {objective.metric!r}"
            if objective.scored():  # the pruner's: scored on the validation rows, once the training has ended
                raise ValueError(
                    f"{said}, which the median pruner reads: set pruner: none to score {objective.metric} on the "
                    "validation rows without pruning"
                )
            if not logs:
                raise ValueError(f"{said}: log it with ctx.log({objective.metric}=...) to tune on it")
            raise ValueError(f"{said}: name one of those as the metric (with its direction)")

    def _check_trials_fit(self) -> None:
        """Every value the space can give, with ``train``, is a training train_model accepts, its
        ``train_config`` checked against the model the training function declares: a misspelled key
        (``train_config.hiden``) or a choice of the wrong type fails here, before the first trial."""
        from trainpipe.contract.config import build
        from trainpipe.contract.errors import InputError
        from trainpipe.training import config_types

        function = self.train.get("train_function", TrainModelParams.model_fields["train_function"].default)
        model = config_types.config_model(function) if isinstance(function, str) else None
        accepted = config_types.accepted_keys(model) if model is not None else None
        for name in self.space:
            key = name.removeprefix("train_config.")
            if name.startswith("train_config.") and accepted is not None and key not in accepted:
                raise ValueError(
                    f"space: {name!r} is not a key of {function}'s config {model.__name__} "  # type: ignore[union-attr]
                    f"(it takes {', '.join(sorted(accepted)) or 'none'})"
                )
        first = {name: p.candidates()[0] for name, p in self.space.items()}
        settings = with_params({k: v for k, v in self.train.items() if k not in NOT_IN_TRAIN}, first)
        for name, param in self.space.items():
            for value in param.candidates():  # each value of each dimension, alone
                try:
                    if name.startswith("train_config."):
                        if model is not None:
                            key = name.removeprefix("train_config.")
                            others = frozenset(model.model_fields) - {key}
                            config_types.validate(model, {key: value}, ignore=others)
                    else:
                        TypeAdapter(TrainModelParams.model_fields[name].annotation or Any).validate_python(value)
                except (InputError, ValidationError) as exc:
                    why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
                    raise ValueError(f"space.{name}: {value!r} does not fit: {why}") from None
        try:  # then train with the space's first values: a whole training train_model takes
            build(TrainModelParams, {**settings, "train_config": settings.get("train_config") or {}}, where="train")
        except InputError as exc:
            raise ValueError(f"train: with the space's first values, a trial is not a training: {exc}") from None


class TuneModelConfig(TuneModelParams):
    """Everything tune_model needs, artifacts included."""

    data: str = Field(
        ..., min_length=1, description="the dataset snapshot (snapshot_dataset's output)", json_schema_extra=SOURCE
    )
    output_dir: str = Field(
        ..., min_length=1, description="the study's report, best settings and trials", json_schema_extra=OUTPUT
    )


class TrialSummary(StrictModel):
    number: int
    state: str
    values: list[float] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    mlflow_run_id: str | None = None


class TuneModelResult(ComponentResult):
    """What tune_model reports: the study, its best trial (or Pareto front) and the settings to train with."""

    study_name: str = Field(description="the Optuna study")
    storage: str = Field(description="its storage (credentials never included)")
    objectives: list[str] = Field(description="the metrics optimized")
    directions: list[str] = Field(description="their directions (minimize, maximize)")
    ran_here: int = Field(description="trials this worker ran")
    complete: int = Field(description="trials completed")
    pruned: int = Field(description="trials pruned")
    failed: int = Field(description="trials failed")
    best_trial: int | None = Field(None, description="the best trial's number")
    best_values: list[float] = Field(default_factory=list, description="its objective values")
    best_params: dict[str, Any] = Field(default_factory=dict, description="its sampled settings")
    best_settings: dict[str, Any] = Field(
        default_factory=dict,
        description="train_model settings of the best trial (train_model's tuned input takes them)",
    )
    pareto_front: list[TrialSummary] = Field(
        default_factory=list, description="the Pareto-optimal trials (several objectives)"
    )
    baseline_trial: int | None = Field(None, description="trial 0: the train section as given")
    baseline_values: list[float] = Field(
        default_factory=list, description="the baseline trial's values (the train section as given)"
    )
    adopted: bool = Field(
        False,
        description="whether best_settings are the best trial's (it beat the baseline) or the train section's",
    )
    mlflow_parent_run_id: str | None = Field(None, description="the study's MLflow parent run")
    report_file: str | None = Field(None, description="the HTML report, relative to output_dir")
    gpu_seconds: float = Field(0.0, description="GPU-seconds its trials' trainings held, over every worker")
    cost: float | None = Field(None, description="what its trials cost at the hardware profile's prices")
    currency: str | None = Field(None, description="the cost's currency")

    def series(self) -> list[tuple[str, str, dict[str, str], float]]:
        """What the study's trials used and cost (Prometheus)."""
        labels = {"study": self.study_name}
        out = [("trainpipe_study_gpu_seconds", "GPU-seconds the study's trials held", labels, self.gpu_seconds)]
        if self.cost is not None:
            out.append(
                (
                    "trainpipe_study_cost",
                    "what the study's trials cost",
                    {**labels, "currency": self.currency or ""},
                    self.cost,
                )
            )
        return out

    def summary(self) -> str:
        if self.best_trial is None:
            return f"study {self.study_name}: {self.ran_here} trials here, none complete yet"
        best = ", ".join(f"{o} {v:.4f}" for o, v in zip(self.objectives, self.best_values, strict=False))
        front = f", Pareto front of {len(self.pareto_front)}" if len(self.objectives) > 1 else ""
        counts = f"study {self.study_name}: {self.complete} complete, {self.pruned} pruned, {self.failed} failed"
        if self.baseline_trial is None or not self.baseline_values:
            return f"{counts}; best trial {self.best_trial}: {best}{front}"
        base = f"{self.objectives[0]} {self.baseline_values[0]:.4f}"
        if self.adopted:
            return f"{counts}; best trial {self.best_trial}: {best}{front}, beats the baseline's {base}: taken"
        return f"{counts}; no trial beat the baseline (the train section as given: {base}): the train section is kept"
