"""The lineage record: typed sections that travel with the data.

Each component adds its own section (``source``, ``features``, ``validation``, ``snapshot``,
``training``, ``training_profile``, ``evaluation``, ``registration``); the entrypoint adds
``code``, ``orchestrator`` and ``image`` and the ``steps`` so far. register_model writes the whole
record onto the model version, so the chain from raw data to model version is never lost.
Artifacts store it as JSON (:meth:`Lineage.to_dict`); a component of a team's own may add a
section of its own (any JSON object) beside trainpipe's.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from trainpipe.contract.errors import InputError


class Section(BaseModel):
    """One step's part of the record; a field with no value is left out of the stored record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_serializer(mode="wrap")
    def _without_empty_fields(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class SourceLineage(Section):
    """The raw data validate_data read: the dataset, or the entity table a training set was joined from."""

    uri: str
    md5: str = Field(description="md5 of the file, or DVC's .dir hash of a folder of Parquet files")
    rows: int
    columns: int


class FeatureViewLineage(Section):
    """One feature view a training set took features from."""

    fingerprint: str = Field(description="sha256 of the view's definition (features, entities, source, TTL)")
    features: list[str]


class FeaturesLineage(Section):
    """The feature store a training set was joined from: which features, as of when."""

    repo: str = Field(description="the Feast feature repository")
    project: str
    service: str | None = Field(None, description="the feature service, when the features named one")
    views: dict[str, FeatureViewLineage]
    entity_md5: str = Field(description="md5 of the entity table (join keys, timestamps, label)")
    timestamp_column: str
    as_of_min: str = Field(description="the entity table's earliest timestamp")
    as_of_max: str = Field(description="its latest: no feature value is newer than its row's timestamp")


class ValidationLineage(Section):
    suite: str
    success: bool
    evaluated: int
    successful: int


class SnapshotLineage(Section):
    """Where the exact bytes can be fetched again: DVC's content hash at a git revision on a remote."""

    md5: str
    rev: str
    path: str
    remote: str
    repo: str


class TrainingRun(BaseModel):
    """How a model was trained: its MLflow run, the function and task, and where it ran. Both the
    lineage's ``training`` section and train_model's result hold these."""

    mlflow_run_id: str = Field(description="the MLflow run that trained the model")
    experiment_id: str = Field(description="its MLflow experiment")
    train_function: str = Field(description="the training function (module:function, or builtin:NAME)")
    task: str = Field(description="classification or regression")
    backend: str = Field(description="the training backend that ran (torch, tensorflow, horovod)")
    dist_backend: str = Field(description="the collective backend that ran (nccl, gloo, or none for one process)")
    device: str = Field(description="cpu or cuda")
    world_size: int = Field(description="ranks that trained")


class TrainingLineage(Section, TrainingRun):
    model_uri: str
    precision: str
    hardware_profile: str
    model_sha256: str
    final_loss: float | None = None
    cluster_job: str | None = Field(None, description="Kind/namespace/name of the multi-node job that trained it")
    wall_seconds: float | None = None
    gpu_seconds: float | None = Field(None, description="accelerators held x wall seconds")
    cpu_core_seconds: float | None = Field(None, description="CPU time of the ranks")
    peak_memory_mb: float | None = None
    cost: float | None = Field(None, description="what the training cost at its hardware profile's prices")
    currency: str | None = None


class TrainingProfileLineage(Section):
    samples_per_second: float
    step_time_ms: float
    world_size: int
    mfu: float | None = None
    recommendations: int
    cost_per_epoch: float | None = Field(None, description="the profiled training's cost per epoch")
    cost_per_1k_samples: float | None = Field(None, description="what 1,000 samples cost at its throughput")
    currency: str | None = None


class EvaluationLineage(Section):
    task: str
    metrics: dict[str, float]
    passed: bool
    n_test: int
    champion_version: str | None = None
    beats_champion: bool | None = None
    alias: str | None = None  # the serving alias whose version was compared (``champion_version``)


class RegistrationLineage(Section):
    """The version made (or found); ``registered: false`` when the gate held the model back."""

    registered: bool | None = None
    model_name: str | None = None
    version: str | None = None
    aliases: list[str] | None = None
    champion_moved: bool | None = None
    signature_sha256: str | None = Field(None, description="sha256 of the signature (model.sig) register_model made")
    lacks: list[str] | None = Field(
        None,
        description="the sections of the chain the model came without: validation (no validate_data ran), snapshot "
        "(no snapshot_dataset ran: its training data cannot be fetched again, nor the lineage verified)",
    )


class DriftLineage(Section):
    """detect_drift's comparison of this data with the champion's training data."""

    dataset_drift: bool
    share_drifted: float
    drifted_columns: list[str]
    retrain: bool
    reference: str = Field(description="lineage, explicit or none")
    champion_version: str | None = None
    reference_md5: str | None = None


class OptimizationLineage(Section):
    """optimize_model's variant handed on (None: none was within its metric drop), and the version
    register_model made of it."""

    variant: str | None = None
    metric: str
    fp32_metric: float
    metric_value: float | None = None
    speedup_b256: float | None = None
    size_ratio: float | None = None
    onnx_sha256: str | None = None
    exporter: str | None = None
    model_name: str | None = None
    version: str | None = None


class TuningLineage(Section):
    """tune_model's study: where it is kept and which trial's settings the training took."""

    study_name: str
    storage: str = Field(description="the study's storage URL, without credentials")
    objectives: list[str]
    finished_trials: int
    best_trial: int
    best_values: list[float]
    mlflow_parent_run_id: str | None = None
    baseline_values: list[float] | None = Field(None, description="trial 0's: the train section as given")
    adopted: bool | None = Field(
        None, description="whether the training took the best trial's settings (they beat the baseline)"
    )
    cost: float | None = Field(None, description="what the study's trials cost at the hardware profile's prices")
    currency: str | None = None


class CodeLineage(Section):
    trainpipe: str
    git_commit: str


class OrchestratorLineage(Section):
    name: str
    run_id: str


class Lineage(BaseModel):
    """The whole record. Sections a step has not reached yet are absent (None)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    source: SourceLineage | None = None
    features: FeaturesLineage | None = None
    validation: ValidationLineage | None = None
    snapshot: SnapshotLineage | None = None
    training: TrainingLineage | None = None
    training_profile: TrainingProfileLineage | None = None
    evaluation: EvaluationLineage | None = None
    registration: RegistrationLineage | None = None
    drift: DriftLineage | None = None
    optimization: OptimizationLineage | None = None
    tuning: TuningLineage | None = None
    code: CodeLineage | None = None
    orchestrator: OrchestratorLineage | None = None
    image: str | None = None
    steps: list[str] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _without_absent_sections(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}

    def with_(self, **sections: Any) -> Lineage:
        """A copy with these sections set (a step adds its own)."""
        return self.model_copy(update=sections)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-able data (what artifacts and the registry store)."""
        return self.model_dump(mode="json")

    @classmethod
    def of(cls, record: Lineage | dict[str, Any] | None) -> Lineage:
        """A record read back from an artifact (a dict), or one already typed.

        Raises:
            InputError: a section does not have the fields this version of trainpipe writes.
        """
        if isinstance(record, Lineage):
            return record
        from pydantic import ValidationError

        try:
            return cls.model_validate(record or {})
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            raise InputError(
                f"lineage: section {where!r} is not what trainpipe writes ({err.get('msg')}); was the artifact made by "
                "another version?"
            ) from None


#: Sections describing the step that runs, not the data: each step sets them anew.
RUN_SECTIONS = ("code", "orchestrator", "image")


def run_sections(orchestrator_name: str | None = None, run_id: str | None = None) -> dict[str, Any]:
    """The sections describing this step's run: code version, orchestrator, image."""
    return {
        "code": CodeLineage(**code_version()),
        "orchestrator": OrchestratorLineage(**orchestrator(orchestrator_name, run_id)),
        "image": image(),
    }


def merge(records: Iterable[Lineage | dict[str, Any]]) -> Lineage:
    """Merge lineage records from several inputs.

    Sections present in more than one record must agree, except the
    :data:`RUN_SECTIONS`, which the current step sets anyway.

    Raises:
        InputError: two inputs disagree about the same section (mixed lineages).
    """
    merged: dict[str, Any] = {}
    for rec in records:
        for key, value in (rec.to_dict() if isinstance(rec, Lineage) else rec).items():
            if key in merged and merged[key] != value and key not in RUN_SECTIONS and key != "steps":
                raise InputError(f"inputs carry conflicting lineage for {key!r}: they come from different runs or data")
            if key == "steps":
                steps = merged.setdefault("steps", [])
                steps.extend(s for s in value if s not in steps)
            else:
                merged[key] = value
    return Lineage.of(merged)


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str]:
    """The code that runs: trainpipe's version and the git commit of its source, if known.

    ``TRAINPIPE_GIT_COMMIT`` (set in images at build time) wins over asking git.
    """
    from trainpipe import __version__

    commit = os.environ.get("TRAINPIPE_GIT_COMMIT", "")
    if not commit:
        src = Path(__file__).resolve().parent
        try:
            out = subprocess.run(
                ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
            )
            commit = out.stdout.strip() if out.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            commit = ""
    return {"trainpipe": __version__, "git_commit": commit or "unknown"}


def orchestrator(name: str | None = None, run_id: str | None = None) -> dict[str, str]:
    """Who runs this step: arguments win, then ``TRAINPIPE_ORCHESTRATOR`` / ``TRAINPIPE_RUN_ID``."""
    return {
        "name": name or os.environ.get("TRAINPIPE_ORCHESTRATOR", "manual"),
        "run_id": run_id or os.environ.get("TRAINPIPE_RUN_ID", ""),
    }


def image() -> str:
    """The container image this step runs in: ``TRAINPIPE_IMAGE_REF`` (set by trainpipe's
    Dockerfile at build time), else ``TRAINPIPE_IMAGE``, else ``local``."""
    return os.environ.get("TRAINPIPE_IMAGE_REF") or os.environ.get("TRAINPIPE_IMAGE", "local")


def flatten(lineage: Lineage | dict[str, Any], prefix: str = "lineage") -> dict[str, str]:
    """Flatten a lineage record to ``lineage.section.key`` strings (for registry tags)."""
    if isinstance(lineage, Lineage):
        lineage = lineage.to_dict()
    out: dict[str, str] = {}

    def walk(obj: Any, key: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{key}.{k}")
        elif isinstance(obj, (list, tuple)):
            out[key] = ",".join(str(x) for x in obj)
        else:
            out[key] = "" if obj is None else str(obj)

    walk(lineage, prefix)
    return out
