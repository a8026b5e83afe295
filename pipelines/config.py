"""The reference pipeline's config: one YAML file drives KFP, Airflow and the CLI.

Every setting that is a component's is taken from that component's spec (name, type, default,
bounds), never written again here: ``train`` is train_model's settings, and the gate's, the
suite's, the dataset's and the registry's settings come from evaluate_model, validate_data,
snapshot_dataset and register_model. The pipeline adds only what is its own: where the raw data
and the local state are, the DVC workspace and remote, the hardware profile, the policy and the
schedule. Relative paths resolve against the config file's folder; everything local defaults to
a place under ``workspace``, the embedded default for a laptop or a CPU server.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, model_validator

from trainpipe.components.detect_drift.spec import DetectDriftParams
from trainpipe.components.evaluate_model.spec import EvaluateModelParams
from trainpipe.components.optimize_model.spec import OptimizeModelParams
from trainpipe.components.register_model.spec import RegisterModelParams
from trainpipe.components.snapshot_dataset.spec import REMOTE_SCHEMES, SnapshotDatasetParams
from trainpipe.components.train_model.spec import TrainModelParams
from trainpipe.components.tune_model.spec import TuneModelParams
from trainpipe.components.validate_data.spec import ValidateDataParams
from trainpipe.contract.config import StrictModel, build, load_file
from trainpipe.contract.errors import InputError
from trainpipe.contract.policy import Policy
from trainpipe.faces.surface import REQUIRED, KfpParam, kfp_params, kfp_value
from trainpipe.pipelines import graph
from trainpipe.services.profiles import PROFILES, HardwareProfile, get_profile

#: train_model settings that are not in ``train:``: the pipeline sets them once for every step
#: (label_column, tracking_uri, experiment_name) or a multi-node launcher sets them per node.
NOT_IN_TRAIN = ("label_column", "tracking_uri", "experiment_name", "node_rank", "rdzv_endpoint")
#: The steps that read their hardware profile (``TRAINPIPE_HARDWARE_PROFILE``, which the KFP pipeline and the
#: DAGs set on them): train_model for its prices (what it cost, its max_cost) and metrics port, tune_model for
#: its cost objective or budget and its trials' trainings, profile_training for the prices its cost per epoch
#: is figured at.
#: The pipeline's graph declares them (a step ``given`` the profile): read from there, as both renderings do.
PROFILE_STEPS = tuple(s.name for s in graph.STEPS if "profile" in s.given)
#: optimize_model settings that are not in ``optimize:``: the pipeline's own (the label, the split's seed).
OPTIMIZE_FROM_PIPELINE = ("label_column", "seed")
#: Pipeline settings taken from a component's spec, by (component, its field).
FROM_SPECS: dict[str, tuple[Any, str]] = {
    "label_column": (TrainModelParams, "label_column"),
    "suite": (ValidateDataParams, "suite"),
    "features": (ValidateDataParams, "features"),
    "feature_repo": (ValidateDataParams, "feature_repo"),
    "entity_timestamp_column": (ValidateDataParams, "entity_timestamp_column"),
    "dataset_name": (SnapshotDatasetParams, "dataset_name"),
    "tracking_uri": (TrainModelParams, "tracking_uri"),
    "experiment_name": (TrainModelParams, "experiment_name"),
    "model_name": (RegisterModelParams, "model_name"),
    "alias": (RegisterModelParams, "alias"),
    "thresholds": (EvaluateModelParams, "thresholds"),
    "min_improvement": (EvaluateModelParams, "min_improvement"),
    "max_regression": (EvaluateModelParams, "max_regression"),
    "metric_functions": (EvaluateModelParams, "metric_functions"),
    "lower_is_better": (EvaluateModelParams, "lower_is_better"),
    "drift_share": (DetectDriftParams, "drift_share"),
    "max_champion_age_days": (DetectDriftParams, "max_champion_age_days"),
}


def _fields(source: Any, names: list[str]) -> dict[str, Any]:
    return {n: (source.model_fields[n].annotation, source.model_fields[n]) for n in names}


def _same_rules(model: Any, values: dict[str, Any]) -> None:
    """Validate ``values`` as the component would; its first complaint becomes this validator's."""
    from pydantic import ValidationError

    try:
        model.model_validate(values)
    except ValidationError as exc:
        raise ValueError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None


_TrainBase = create_model(  # type: ignore[call-overload]
    "_TrainBase",
    __base__=StrictModel,
    **_fields(TrainModelParams, [n for n in TrainModelParams.model_fields if n not in NOT_IN_TRAIN]),
)


class TrainSettings(_TrainBase):  # type: ignore[misc, valid-type]
    """train_model's settings in a pipeline (every one but those in :data:`NOT_IN_TRAIN`)."""

    if TYPE_CHECKING:  # fields made from the components' specs (create_model), as the type checker sees them
        max_cost: Any = None
        train_function: Any = None
        slurm: Any = None

    @model_validator(mode="after")
    def _as_train_model(self) -> TrainSettings:
        # the same cross-field rules as train_model itself (batch size and world size, ...)
        _same_rules(TrainModelParams, self.model_dump())
        return self


_OptimizeBase = create_model(  # type: ignore[call-overload]
    "_OptimizeBase",
    __base__=StrictModel,
    **_fields(OptimizeModelParams, [n for n in OptimizeModelParams.model_fields if n not in OPTIMIZE_FROM_PIPELINE]),
)


class OptimizeSettings(_OptimizeBase):  # type: ignore[misc, valid-type]
    """optimize_model's settings in a pipeline (all but :data:`OPTIMIZE_FROM_PIPELINE`), and whether it runs."""

    enabled: bool | None = Field(
        None,
        description="run optimize_model between the gate and register_model (its accepted variant is registered beside "
        "the model); "
        "unset: the hardware profile decides (cpu-smb: on, cpu and gpu: off)",
    )

    def settings(self) -> dict[str, Any]:
        """The step's settings (JSON values), without the switch."""
        return self.model_dump(mode="json", exclude={"enabled"})

    def for_profile(self, profile: Any) -> dict[str, Any] | None:
        """The step's settings when it runs under this hardware profile (``enabled``, else the
        profile's ``optimize``), else None."""
        enabled = self.enabled if self.enabled is not None else profile.optimize
        return self.settings() if enabled else None


#: tune_model settings that are not in ``tune:``: the pipeline's own (the label, tracking, the split's
#: seed), and the ones the fan-out sets for each worker.
TUNE_FROM_PIPELINE = ("label_column", "tracking_uri", "experiment_name", "seed", "summarize", "worker")

_TuneBase = create_model(  # type: ignore[call-overload]
    "_TuneBase",
    __base__=StrictModel,
    **_fields(TuneModelParams, [n for n in TuneModelParams.model_fields if n not in TUNE_FROM_PIPELINE]),
)


class TuneSettings(_TuneBase):  # type: ignore[misc, valid-type]
    """tune_model before train_model: its settings (all but :data:`TUNE_FROM_PIPELINE`) and its workers.
    The trials take the config's ``train`` section, with ``tune.train`` over it."""

    if TYPE_CHECKING:  # fields made from the components' specs (create_model), as the type checker sees them
        space: Any = None
        train: Any = None
        max_cost: Any = None
        objectives: Any = None

    workers: int = Field(
        1, ge=1, le=64, description="parallel workers on the study (KFP dsl.ParallelFor, Airflow .expand)"
    )

    def settings(self, train: dict[str, Any]) -> dict[str, Any]:
        """tune_model's settings (JSON values) for trials on ``train`` (the config's train section, less what
        the space searches), ``tune.train`` over it. Checked as tune_model checks them by the config that holds
        both (:class:`PipelineConfig`): the space against the training function ``train`` names."""
        out = self.model_dump(mode="json", exclude={"workers"})
        out["train"] = {**{k: v for k, v in train.items() if k not in self.space}, **out["train"]}
        return out


_SpecBase = create_model(  # type: ignore[call-overload]
    "_SpecBase",
    __base__=StrictModel,
    **{name: (src.model_fields[f].annotation, src.model_fields[f]) for name, (src, f) in FROM_SPECS.items()},
)


class PipelineConfig(_SpecBase):  # type: ignore[misc, valid-type]
    """Settings of the reference training pipeline."""

    if TYPE_CHECKING:  # fields made from the components' specs (create_model), as the type checker sees them
        tracking_uri: Any = None
        features: Any = None
        feature_repo: Any = None
        suite: Any = None
        alias: Any = None

    data: str = Field(
        ...,
        min_length=1,
        description="the raw dataset: a .csv or .parquet file, or a directory of .parquet files; with features: the "
        "entity table the training set is joined to",
    )
    workspace: str = Field(".trainpipe", description="local state: DVC workspace and remote, MLflow DB, run outputs")
    dvc_repo_dir: str | None = Field(None, description="snapshot_dataset's repo_dir (default: <workspace>/dvc-repo)")
    dvc_remote_url: str | None = Field(
        None, description="snapshot_dataset's remote_url (default: <workspace>/dvc-remote)"
    )
    train: TrainSettings = Field(default_factory=TrainSettings)
    optimize: OptimizeSettings = Field(default_factory=OptimizeSettings)
    tune: TuneSettings | None = Field(
        None, description="search train_model's settings with tune_model first; the training takes the best trial's"
    )
    profile: str = Field(
        "cpu", description="hardware profile: cpu, cpu-smb (optimizes models for CPU serving), gpu, or a YAML file"
    )
    retrain_on: Literal["always", "drift"] = Field(
        "always",
        description="always: every run trains; drift: only when detect_drift finds drift against the champion's "
        "training data, "
        "the champion is older than max_champion_age_days, or there is none (the retraining DAG always decides on "
        "drift)",
    )
    policy: Policy | None = Field(
        None,
        description="data residency, TLS, encryption and audit rules (default: TRAINPIPE_POLICY); every step gets it",
    )
    require_approval: bool = Field(
        False,
        description="a person approves before the serving alias moves: register_model registers the challenger only; "
        "the Airflow "
        "DAGs wait for Airflow's approval (rejected when approval_timeout_hours pass), on Kubeflow `trainpipe promote` "
        "moves it",
    )
    approval_timeout_hours: float = Field(
        24.0,
        gt=0,
        le=24 * 90,
        description="how long the DAG waits for approval before it rejects (while it waits, the next scheduled run "
        "waits too: one run at a time)",
    )
    schedule: str | None = Field(
        "@daily",
        min_length=1,
        description="the training DAG's schedule: a cron expression or preset; null for triggered runs only",
    )

    @model_validator(mode="after")
    def _check_metrics(self) -> PipelineConfig:
        _same_rules(
            EvaluateModelParams,
            {
                k: getattr(self, k)
                for k in ("thresholds", "min_improvement", "max_regression", "metric_functions", "lower_is_better")
            },
        )
        _same_rules(ValidateDataParams, {"features": self.features, "feature_repo": self.feature_repo})
        return self

    @model_validator(mode="after")
    def _check_tune(self) -> PipelineConfig:
        # as tune_model checks them, on the trials' settings: the train section under tune.train, so the space
        # is checked against the function the train section names (its typed config), not the default one
        if self.tune is not None:
            try:
                _same_rules(TuneModelParams, self.tune.settings(self._train_as_written()))
            except ValueError as exc:
                raise ValueError(f"tune.{exc}") from None
        return self

    def _train_as_written(self) -> dict[str, Any]:
        """The train section's settings the config sets (JSON values); train_model's defaults fill the rest."""
        return self.train.model_dump(mode="json", exclude_unset=True)

    def resolved(self, base: Path | None = None) -> PipelineConfig:
        """A copy with every local path absolute and every default filled in."""
        base = base or Path.cwd()

        def absolute(p: str) -> str:
            return p if "://" in p or p.startswith("builtin:") else str((base / p).resolve())

        def profile(p: str) -> str:  # a file beside the config; a built-in's name (or a mistake) as written
            return absolute(p) if p not in PROFILES and p.endswith((".yaml", ".yml", ".json")) else p

        ws = Path(absolute(self.workspace))
        tracking = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ws / 'mlflow.db'}"
        return self.model_copy(
            update={
                "data": absolute(self.data),
                "workspace": str(ws),
                "suite": absolute(self.suite),
                "feature_repo": absolute(self.feature_repo) if self.feature_repo else "",
                "dvc_repo_dir": absolute(self.dvc_repo_dir) if self.dvc_repo_dir else str(ws / "dvc-repo"),
                "dvc_remote_url": absolute(self.dvc_remote_url) if self.dvc_remote_url else str(ws / "dvc-remote"),
                "tracking_uri": tracking,
                "profile": profile(self.profile),
            }
        )

    def check_profile(self, profile: str | None = None) -> HardwareProfile:
        """The hardware profile the pipeline runs under (``profile``, default the config's), read now, and
        the settings that need what it declares: a budget in money (``max_cost``) or a cost objective needs
        its ``prices``. Refused here, before any step runs; each step checks again where it runs.

        Raises:
            InputError: the profile cannot be read, or a cost setting on a profile without prices.
        """
        hardware = get_profile(profile or self.profile)
        if hardware.prices is not None:
            return hardware
        tune = self.tune
        costly = {"train.max_cost": self.train.max_cost is not None}
        if tune is not None:
            costly["tune.train.max_cost"] = tune.train.get("max_cost") is not None
            costly["tune.max_cost"] = tune.max_cost is not None
            costly["tune.objectives"] = any(o.metric == "cost" for o in tune.objectives)
        for field, needs_prices in costly.items():
            if needs_prices:
                raise InputError(
                    f"pipeline config field {field!r}: the hardware profile {hardware.name!r} declares no prices, so "
                    "nothing has a cost (give the profile prices:, or budget in GPU-hours: max_gpu_hours, gpu_seconds)"
                )
        return hardware

    def check_engine(self, engine: str) -> None:
        """What the engine that runs the pipeline here cannot do, refused before any step runs (a dry run too): a
        Slurm job is submitted with sbatch from the machine that runs the step; kfp-local runs the KFP face, which
        reaches no Slurm (its pods carry no Slurm clients), and airflow-local submits from this machine.

        Raises:
            InputError: a ``train.slurm`` section the engine cannot submit, in one line naming the field.
        """
        import shutil

        if self.train.slurm is None:
            return
        if engine == "kfp-local":
            raise InputError(
                "pipeline config field 'train.slurm': the kfp-local engine cannot reach Slurm (the KFP face's pods "
                "have no Slurm clients); run it with --engine airflow-local, or train_model from the CLI"
            )
        if engine == "airflow-local" and shutil.which("sbatch") is None:
            raise InputError(
                "pipeline config field 'train.slurm': airflow-local submits the job with sbatch from this machine, "
                "and no sbatch is on its PATH (run it on a login node of the cluster)"
            )

    def optimize_settings(self, profile: str | None = None) -> dict[str, Any] | None:
        """optimize_model's settings when the pipeline runs it under ``profile`` (default the config's):
        ``optimize.enabled``, else the hardware profile's ``optimize``; else None."""
        return self.optimize.for_profile(get_profile(profile or self.profile))

    def tune_settings(self) -> dict[str, Any] | None:
        """tune_model's settings and its ``workers`` when the pipeline tunes first, else None."""
        if self.tune is None:
            return None
        settings = self.tune.settings(self._train_as_written())
        # the study of each run (named after it) in one SQLite file of the workspace, unless a database is given
        settings["storage"] = settings["storage"] or f"sqlite:///{Path(self.workspace) / 'tune' / 'study.db'}"
        trusted = self.trusted_code()  # the steps that rebuild the team's model trust its package: the study too
        if trusted and trusted not in settings["trusted_packages"]:
            settings["trusted_packages"] = [*settings["trusted_packages"], trusted]
        return {**settings, "workers": self.tune.workers}

    def optimizes(self, profile: str | None = None) -> bool:
        """Whether the pipeline runs optimize_model (see :meth:`optimize_settings`)."""
        return self.optimize_settings(profile) is not None

    def trusted_code(self) -> str:
        """The package of the config's training function: the steps that rebuild its model may import it."""
        fn = self.train.train_function
        return "" if fn.startswith("builtin:") else fn.partition(":")[0].split(".")[0]

    def effective_policy(self) -> Policy:
        """The config's policy, else the one in force (``TRAINPIPE_POLICY``)."""
        from trainpipe.contract.policy import load_policy

        return self.policy if self.policy is not None else load_policy()

    def check_policy(self) -> Policy:
        """What can be known before anything runs: the DVC remote, the tracking server, the workspace.

        Each step checks again at run time against what it is about to touch.

        Raises:
            InputError: a location, region, endpoint or missing encryption the policy refuses.
        """
        from trainpipe.contract import policy as p

        policy = self.effective_policy()
        if self.tracking_uri:
            p.check_endpoint("tracking_uri", self.tracking_uri, policy)
        if self.dvc_remote_url:
            p.check_scheme("dvc_remote_url", self.dvc_remote_url, REMOTE_SCHEMES)
            p.check_store("dvc_remote_url", self.dvc_remote_url, policy.sse, policy=policy)
        p.check_location("workspace", self.workspace, p.env_region(), policy)
        return policy

    def pipeline_arguments(self) -> dict[str, Any]:
        """The KFP pipeline's arguments for this config (resolve first): the same names, ``train``
        flattened, each as its KFP parameter carries it (:func:`pipeline_parameters`)."""
        out: dict[str, Any] = {}
        for param in pipeline_parameters():
            source = self.train if param.name in TrainSettings.model_fields else self
            out[param.name] = kfp_value(getattr(source, param.name), param)
        return out


#: Settings of the pipeline config the KFP pipeline does not take as parameters (they shape the
#: compiled pipeline or the local run instead).
NOT_PIPELINE_PARAMETERS = (
    "workspace",
    "profile",
    "policy",
    "schedule",
    "train",
    "optimize",
    "tune",
    "require_approval",
    "approval_timeout_hours",
)


#: Pipeline parameters the resolved config always fills (a default of its own, or a place under
#: ``workspace``): required on the KFP pipeline, whose caller passes the resolved config's values.
RESOLVED = ("data", "dvc_repo_dir", "dvc_remote_url", "tracking_uri")
#: Pipeline parameters that name a place (a file, a folder, a store, a service): :meth:`PipelineConfig.resolved`
#: makes a relative one absolute against the config's folder, so a path there is this machine's.
PLACES = ("data", "suite", "feature_repo", "dvc_repo_dir", "dvc_remote_url", "tracking_uri")
#: A step's setting that the pipeline (and the DAG) names otherwise: (component, its setting) -> the
#: pipeline's setting. Every other step setting that shares a pipeline setting's name takes it.
RENAMED: dict[tuple[str, str], str] = {
    ("snapshot_dataset", "repo_dir"): "dvc_repo_dir",
    ("snapshot_dataset", "remote_url"): "dvc_remote_url",
}
#: A step's setting that shares a pipeline setting's name but is not that setting: it keeps its own value.
NOT_FROM_PIPELINE: dict[tuple[str, str], str] = {
    (
        "profile_training",
        "profile_steps",
    ): "the steps its own profiling pass traces; in a pipeline it reads train_model's",
    (
        "profile_training",
        "train",
    ): "the settings of its own profiling pass; in a pipeline it profiles train_model's run",
    ("tune_model", "train"): "the trials' fixed settings: the config's train section, compiled in",
    ("tune_model", "max_cost"): "the study's budget: the tune section's own, compiled in (train's is each training's)",
    ("tune_model", "max_gpu_hours"): "the study's budget: the tune section's own (train's is each training's)",
}


def pipeline_parameters() -> list[KfpParam]:
    """The KFP pipeline's parameters: the config's settings that are not :data:`NOT_PIPELINE_PARAMETERS`
    and ``train``'s (flattened), with the config's defaults; the :data:`RESOLVED` ones required."""
    top = [name for name in PipelineConfig.model_fields if name not in NOT_PIPELINE_PARAMETERS]
    params = kfp_params(PipelineConfig, top) + kfp_params(TrainSettings)
    params = [dataclasses.replace(p, default=REQUIRED) if p.name in RESOLVED else p for p in params]
    return sorted(params, key=lambda p: p.default is not REQUIRED)  # required first, each group in order


def pipeline_names(component: str, settings: Iterable[str]) -> dict[str, str]:
    """Which of a step's settings take a pipeline setting, and which: ``{its setting: the pipeline's}``.

    The KFP pipeline binds its parameters by this and the DAGs their params, so a step never falls
    back to its own default for something the pipeline was told."""
    names = {p.name for p in pipeline_parameters()}
    out = {}
    for setting in settings:
        wanted = RENAMED.get((component, setting), setting)
        if wanted in names and (component, setting) not in NOT_FROM_PIPELINE:
            out[setting] = wanted
    return out


def load_pipeline_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> PipelineConfig:
    """Load and resolve a pipeline config file (relative paths against its folder).

    Raises:
        InputError: one line naming every bad field.
    """
    data: dict[str, Any] = load_file(path) if path else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    base = Path(path).resolve().parent if path else Path.cwd()
    config = build(PipelineConfig, data, where="pipeline config").resolved(base)
    config.check_profile()
    return config
