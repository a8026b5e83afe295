"""tune_model's study: its storage and lock, claiming it for a run, its folders, its tuning rows and its
MLflow parent run. optuna, mlflow and pandas are imported inside the functions."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainpipe.components.tune_model.spec import (
    NAME,
    TuneModelConfig,
)
from trainpipe.contract.errors import (
    InputError,
    ServiceUnavailable,
    TrainpipeError,
)
from trainpipe.contract.io import atomic_write_json
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.runtime import Runtime
from trainpipe.contract.text import redact
from trainpipe.data.tabular import find_dataset

ROWS_FILE = "tuning_rows.parquet"
#: A study's own folder in output_dir (``studies/<study_name>``): its tuning rows and its trials' trainings
#: (``trial-<n>``). Another study in the same output_dir has its own, so no trial ever resumes another
#: study's checkpoint, nor trains on another study's rows.
STUDIES_DIR = "studies"
#: The file in a study's folder that says whose it is: the study's name, id and storage.
FOLDER_MARK = ".study.json"
#: The study's id, recorded on the study and in its folder: a study deleted and made again under the same
#: name, or one of that name in another storage, is another study.
ID_ATTR = "trainpipe.study_id"
#: Recorded on a study when it is made: what it searches (a run that finds it made for another search
#: refuses it) and the run that made it (the workers and retries of that run join it; another run resumes
#: it only when told to).
SEARCH_ATTR, OWNER_ATTR = "trainpipe.search", "trainpipe.run_id"


def search_of(config: TuneModelConfig, lineage: Lineage) -> dict[str, str]:
    """What a study searches, part by part: its space, training function, train section, objectives, data."""
    from trainpipe.contract.io import dataset_digest

    def digest(value: Any) -> str:
        return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]

    train = dict(config.train)
    snapshot = lineage.snapshot
    return {
        "space": digest({k: v.model_dump() for k, v in config.space.items()}),
        "train_function": str(train.pop("train_function", "builtin:mlp")),
        "train": digest(train),
        "objectives": digest([o.model_dump() for o in config.objectives]),
        "data": snapshot.md5 if snapshot and snapshot.md5 else dataset_digest(find_dataset(config.data, "data")),
        "validation": digest([config.validation_fraction, config.seed, config.label_column, config.baseline]),
    }


def storage_url(config: TuneModelConfig) -> str:
    return config.storage or f"sqlite:///{(Path(config.output_dir) / 'study.db').resolve()}"


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


def open_study(config: TuneModelConfig, search: dict[str, str] | None = None, run_id: str = "") -> Any:
    """Create the study, or load the one the other workers of this run share; another run's study only with
    ``resume``, and never one made for another search.

    Raises:
        InputError: the study was made for another search, by another run (without ``resume``), or with
            other directions.
    """
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
    sampler = optuna.samplers.TPESampler(seed=config.sampler_seed + config.worker, n_startup_trials=4)
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
            from trainpipe.services.tracking import first_line

            raise ServiceUnavailable(f"storage: cannot open {redact(url)}: {first_line(exc)}") from None
        made_before = config.study_name in optuna.get_all_study_names(storage)
        if not made_before:  # before the study is made: a refusal leaves nothing behind
            _free_folder(config, url, "")
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
        if search is not None:
            _claim(study, config, search, run_id, made_before, url)
        _own_folder(study, config, url)
    if [d.name.lower() for d in study.directions] != directions:
        raise InputError(
            f"objectives: study {config.study_name!r} in {redact(url)} was made with directions "
            f"{[d.name.lower() for d in study.directions]}, not {directions}"
        )
    return study


def _claim(
    study: Any, config: TuneModelConfig, search: dict[str, str], run_id: str, made_before: bool, url: str
) -> None:
    """A new study records its search and its run; a study made before must be this search, and this run's
    (its workers, a retry) or resumed on purpose: a new run never silently returns an earlier study's result."""
    if not made_before:
        study.set_user_attr(SEARCH_ATTR, search)
        study.set_user_attr(OWNER_ATTR, run_id)
        return
    made_for = study.user_attrs.get(SEARCH_ATTR)
    if made_for is not None and made_for != search:
        differs = [k for k in search if made_for.get(k) != search[k]]
        raise InputError(
            f"study_name: study {config.study_name!r} in {redact(url)} was made for another search (its "
            f"{', '.join(differs)} differ); give another study_name, or delete that study to start it again"
        )
    owner = study.user_attrs.get(OWNER_ATTR)
    if config.resume or (run_id and owner == run_id):
        return
    from optuna.trial import TrialState

    done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.get_trials(deepcopy=False))
    by = f"run {owner!r}" if owner else "another run"
    raise InputError(
        f"study_name: study {config.study_name!r} in {redact(url)} was made by {by} and has {done} finished "
        "trials; set resume: true to continue it, or give another study_name"
    )


def study_dir(config: TuneModelConfig) -> Path:
    """The study's own folder in output_dir: its tuning rows and its trials (see :data:`STUDIES_DIR`)."""
    return Path(config.output_dir) / STUDIES_DIR / str(config.study_name)


def trial_dir(config: TuneModelConfig, number: int) -> Path:
    """Trial ``number``'s training: in its study's folder, so no other study's trial of that number shares it."""
    return study_dir(config) / f"trial-{number:04d}"


def _folder_mark(folder: Path) -> dict[str, Any] | None:
    try:
        mark = json.loads((folder / FOLDER_MARK).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) else None


def _free_folder(config: TuneModelConfig, url: str, study_id: str) -> None:
    """The study's folder holds no other study's trials: where it holds those of a study of the same name that
    is gone from this storage (deleted, and maybe made again), they are removed; where they are a study's in
    another storage, that study may still run, so this one is refused.

    Raises:
        InputError: the folder is another storage's study's.
    """
    import shutil

    folder = study_dir(config)
    mark = _folder_mark(folder)
    if mark is None or (study_id and mark.get("study_id") == study_id):
        return
    if mark.get("storage") != redact(url):
        raise InputError(
            f"study_name: {folder} holds the trials of another study named {config.study_name!r} (in "
            f"{mark.get('storage')}); give another study_name or output_dir, or remove that folder"
        )
    gone = f"the trials of an earlier study {config.study_name!r}, gone from its storage"
    print(f"{NAME}: removing {folder}: {gone}", file=sys.stderr)
    shutil.rmtree(folder)


def _own_folder(study: Any, config: TuneModelConfig, url: str) -> None:
    """Give the study an id (once) and mark its folder with it (see :func:`_free_folder`)."""
    import uuid

    study_id = study.user_attrs.get(ID_ATTR)
    if not study_id:
        study_id = uuid.uuid4().hex
        study.set_user_attr(ID_ATTR, study_id)
    _free_folder(config, url, study_id)
    folder = study_dir(config)
    if _folder_mark(folder) is None:
        folder.mkdir(parents=True, exist_ok=True)
        mark = {"study_name": config.study_name, "study_id": study_id, "storage": redact(url)}
        atomic_write_json(folder / FOLDER_MARK, mark)


def tuning_rows(config: TuneModelConfig, out: Path) -> Path:
    """The training side of the snapshot's split (as the final training will split it), written once:
    the rows evaluate_model holds out never reach a trial."""
    import pandas as pd

    from trainpipe.data.tabular import held_out, iter_chunks

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


def study_name_for(lineage: Lineage, search: dict[str, str]) -> str:
    """``trainpipe-<run id>``: the workers of one orchestrator run share a study, the next run starts its own;
    by hand ``trainpipe-<hash of the search>``: another search never lands in the same study."""
    run = lineage.orchestrator.run_id if lineage.orchestrator and lineage.orchestrator.run_id else ""
    if run:
        return f"trainpipe-{re.sub(r'[^A-Za-z0-9_.-]', '_', run)}"[:128]
    return "trainpipe-" + hashlib.sha256(json.dumps(search, sort_keys=True).encode()).hexdigest()[:12]


def parent_run(study: Any, config: TuneModelConfig, runtime: Runtime) -> str:
    """The study's MLflow run, which every trial's training run is nested under: made by the first
    worker, found by the others in the study's own attributes."""
    from trainpipe.services import tracking

    with study_lock(storage_url(config)):
        known = study.user_attrs.get("mlflow_parent_run_id")
        if known:
            _running_again(config, str(known))
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
                    "trainpipe.storage": redact(storage_url(config)),
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


def _running_again(config: TuneModelConfig, parent: str) -> None:
    """A study continued after its run ended (a worker stopped, a budget reached) runs it again."""
    from trainpipe.services import tracking

    try:
        client = tracking.connect(config.tracking_uri)
        if client.get_run(parent).info.status != "RUNNING":
            client.update_run(parent, status="RUNNING")
    except Exception as exc:
        raise tracking.classify(exc, "tracking_uri: opening the study's run", "failed") from None
