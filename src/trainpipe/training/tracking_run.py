"""The training's MLflow run: opened on a thread beside the ranks (:class:`TrackingThread`), found again by a
retry or a rerun into the same checkpoints (never a duplicate run), and logged to once the ranks are done:
the epochs' metrics, the model (once per weights), what the training used and cost.

MLflow is imported on the thread and at the end, never where the ranks start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from trainpipe.contract import errors
from trainpipe.contract.io import file_digest
from trainpipe.contract.layout import EPOCH_METRICS_FILE, MODEL_FILE, MODEL_META
from trainpipe.contract.lineage import Lineage, SnapshotLineage
from trainpipe.contract.policy import Policy
from trainpipe.contract.text import redact
from trainpipe.data.tabular import find_dataset
from trainpipe.services.costs import Spending
from trainpipe.services.tracking import PARENT_RUN_ENV, RUN_NAME_ENV
from trainpipe.training.settings import TrainModelConfig

#: The component that opens the run (its runs' ``trainpipe.component`` tag).
COMPONENT = "train_model"


class TrackingThread(threading.Thread):
    """Opens (or reuses) the training's MLflow run while the ranks start and train; :meth:`result` waits for it
    and raises what it raised (MLflow unreachable, a refused store)."""

    def __init__(self, config: TrainModelConfig, lineage: Lineage, policy: Policy) -> None:
        super().__init__(name="trainpipe-mlflow", daemon=True)
        self.config, self.lineage, self.policy = config, lineage, policy
        self.client: Any = None
        self.run_id = self.exp_id = self.uri = ""
        self.finished = False  # the run is a finished training's (a rerun of it): a failed rerun leaves it so
        self.error: BaseException | None = None

    def run(self) -> None:
        # the ranks come first: this thread (imports, the run, the store) takes the cores they leave
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            from trainpipe.services import tracking

            c = self.config
            self.client = tracking.connect(c.tracking_uri, self.policy)
            self.uri = tracking.resolve_tracking_uri(c.tracking_uri, self.policy)
            self.exp_id = tracking.ensure_experiment(self.client, c.experiment_name, self.uri)
            tracking.prepare_artifact_store(self.client, self.policy, experiment_id=self.exp_id)
            snapshot = self.lineage.snapshot
            orchestrator_run = self.lineage.orchestrator.run_id if self.lineage.orchestrator else ""
            self.run_id, reused = open_run(self.client, self.exp_id, c, snapshot, orchestrator_run)
            self.finished = reused and self.client.get_run(self.run_id).info.status == "FINISHED"
            remember_run(c, self.run_id, self.exp_id, training_key(c, snapshot))
            if not reused:
                log_params_and_input(self.client, self.run_id, c, snapshot)
            # what logging the model needs once the ranks are done, imported while they train (on a
            # busy machine the import shares the cores; after training it would add to the wall time)
            import mlflow.models  # noqa: F401
            import mlflow.pyfunc  # noqa: F401
        except BaseException as exc:  # raised in the launcher's thread by result()
            self.error = exc

    def result(self) -> TrackingThread:
        self.join()
        if self.error is not None:
            raise self.error
        return self

    def end(self, status: str) -> None:
        """Once the thread is done, mark the run it opened ``status`` (FAILED, KILLED): never left RUNNING. A
        finished training's run (a rerun of it) stays FINISHED."""
        self.join()
        if self.client is not None and self.run_id and not self.finished:
            self.client.set_terminated(self.run_id, status=status)


def log_training(
    config: TrainModelConfig,
    t: TrackingThread,
    out: Path,
    spending: Spending,
    history: list[dict[str, Any]],
    wall: float,
) -> tuple[str, str, Any, dict[str, float]]:
    """The epochs' metrics, the model (once per weights) and what the step used and cost, logged to the run, which
    ends FINISHED. Returns the weights' sha256, the logged model's URI, the usage and its figures.

    Raises:
        ServiceUnavailable: the tracking server cannot be reached.
    """
    from mlflow.entities import Metric

    from trainpipe.services import tracking
    from trainpipe.services.serving import package

    client, run_id, prices = t.client, t.run_id, spending.prices
    now = int(time.time() * 1000)
    try:
        if not client.get_metric_history(run_id, "train_wall_seconds"):  # a retried attempt logs its history once
            metrics = [
                Metric(f"train_{k}", float(v), now, int(h["epoch"]))
                for h in history
                for k, v in h.items()
                if k not in ("epoch", "step") and isinstance(v, (int, float)) and v == v
            ]
            for i in range(0, len(metrics), 1000):
                client.log_batch(run_id, metrics=metrics[i : i + 1000])
        client.log_metric(run_id, "train_wall_seconds", wall)
        sha = model_digest(out)
        tags = client.get_run(run_id).data.tags
        model_uri = tags.get("trainpipe.model_uri", "") if tags.get("trainpipe.model_sha256") == sha else ""
        if not model_uri:  # a rerun of a finished training whose run holds this very model logs it once
            for name in (MODEL_META, EPOCH_METRICS_FILE):
                client.log_artifact(run_id, str(out / name), artifact_path="train_model")
            model_uri = package.log_model(run_id, out, config.serving_requirements)
            client.set_tag(run_id, "trainpipe.model_sha256", sha)
            client.set_tag(run_id, "trainpipe.model_uri", model_uri)
        spending.record()  # what logging the model used is the step's too: one figure from here on, everywhere
        usage = spending.total
        spent = usage.figures(prices)
        for key, value in spent.items():
            client.log_metric(run_id, f"train_{key}", value)
        if prices is not None:
            client.set_tag(run_id, "trainpipe.cost_currency", prices.currency)
        client.set_terminated(run_id, status="FINISHED")
    except errors.TrainpipeError:
        raise
    except Exception as exc:
        raise tracking.classify(exc, f"tracking_uri: logging the training run to {redact(t.uri)!r}", "failed") from None
    return sha, model_uri, usage, spent


def model_digest(out: Path) -> str:
    """The weights file's sha256: the one its writer took of the bytes as it wrote them, kept beside the file for
    that very file (inode, size, mtime); else read and hashed here (a 4 GB model is seconds of reading)."""
    from trainpipe.training.weights_file import recorded_digest

    return recorded_digest(out / MODEL_FILE) or file_digest(out / MODEL_FILE, "sha256")


#: Beside the checkpoints: the MLflow run of the training they hold (its id, experiment and the training's key).
RUN_FILE = "mlflow_run.json"


def training_key(config: TrainModelConfig, snapshot: SnapshotLineage | None) -> str:
    """What makes two trainings the same: the data's content and every setting but where things are written."""
    settings = json.dumps(
        config.model_dump(mode="json", exclude={"output_dir", "checkpoint_dir", "tracking_uri"}), sort_keys=True
    )
    return hashlib.sha256(f"{snapshot.md5 if snapshot else ''}|{settings}".encode()).hexdigest()


def remember_run(config: TrainModelConfig, run_id: str, exp_id: str, key: str) -> None:
    """Keep the training's MLflow run beside its checkpoints: a rerun that resumes from them continues that run."""
    from trainpipe.contract.io import atomic_write_json

    folder = config.checkpoint_folder
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / RUN_FILE, {"run_id": run_id, "experiment_id": exp_id, "key": key})


def remembered_run(client: Any, exp_id: str, config: TrainModelConfig, key: str) -> Any:
    """The run kept beside the checkpoints, when it is this training's (same data and settings) in this
    experiment and still there; else None."""
    try:
        kept = json.loads((config.checkpoint_folder / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key or kept.get("experiment_id") != exp_id:
        return None
    try:
        run = client.get_run(str(kept.get("run_id")))
    except Exception:  # noqa: BLE001 (deleted, or another server's: a new run is made)
        return None
    return run if run.info.lifecycle_stage == "active" else None


def open_run(
    client: Any, exp_id: str, config: TrainModelConfig, snapshot: SnapshotLineage | None, orchestrator_run: str
) -> tuple[str, bool]:
    """The MLflow run of this training: a retry of the same orchestrator run on the same data and
    settings reuses the run its earlier attempt opened, and so does any rerun into the same checkpoints
    (by hand, a retry without a run id, a rerun of a finished output folder), so neither makes a
    duplicate run. A finished run is left finished: its rerun logs into it only what changed.

    Returns:
        The run id, and whether it was reused.
    """
    md5 = snapshot.md5 if snapshot else ""
    local = training_key(config, snapshot)
    key = hashlib.sha256(f"{orchestrator_run}|{local}".encode()).hexdigest()
    if orchestrator_run:
        found = client.search_runs([exp_id], filter_string=f"tags.`trainpipe.attempt_key` = '{key}'", max_results=1)
        if found:
            if found[0].info.status != "FINISHED":
                client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id, True
    kept = remembered_run(client, exp_id, config, local)
    if kept is not None:
        if kept.info.status != "FINISHED":
            client.update_run(kept.info.run_id, status="RUNNING")
        return kept.info.run_id, True
    run = client.create_run(
        exp_id,
        tags={
            "mlflow.runName": os.environ.get(RUN_NAME_ENV) or f"train-{(md5 or 'data')[:8]}",
            "trainpipe.component": COMPONENT,
            "trainpipe.train_function": config.train_function,
            "trainpipe.dataset_md5": md5,
            "trainpipe.orchestrator_run_id": orchestrator_run,
            "trainpipe.attempt_key": key,
            **({"mlflow.parentRunId": os.environ[PARENT_RUN_ENV]} if os.environ.get(PARENT_RUN_ENV) else {}),
        },
    )
    return run.info.run_id, False


def log_params_and_input(client: Any, run_id: str, config: TrainModelConfig, snapshot: SnapshotLineage | None) -> None:
    """The settings as params, and the snapshot as the run's training input (name, content hash,
    source and columns: read from the file's header or footer, never the whole table)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag, Param

    from trainpipe.data.tabular import dataset_columns

    params = config.model_dump(
        mode="json", exclude={"data", "output_dir", "checkpoint_dir", "tracking_uri", "cluster", "slurm"}
    )
    flat = [
        Param(k, (json.dumps(v) if isinstance(v, (list, dict)) else str(v))[:6000]) for k, v in sorted(params.items())
    ]
    path = find_dataset(config.data, "data")
    source = f"{snapshot.remote}#{snapshot.path}@{snapshot.rev}" if snapshot else str(path)
    schema = json.dumps({"mlflow_colspec": [{"name": c, "type": "double"} for c in dataset_columns(path)]})
    dataset = Dataset(
        name=Path(snapshot.path if snapshot else str(path)).name,
        digest=(snapshot.md5 if snapshot else "")[:36] or "unknown",
        source_type="dvc" if snapshot else "local",
        source=json.dumps({"uri": source}),
        schema=schema,
    )
    client.log_batch(run_id, params=flat)
    client.log_inputs(
        run_id,
        datasets=[
            DatasetInput(
                dataset,
                tags=[
                    InputTag("mlflow.data.context", "training"),
                    InputTag("trainpipe.dataset_md5", snapshot.md5 if snapshot else ""),
                ],
            )
        ],
    )


__all__ = ["RUN_FILE", "TrackingThread", "log_training", "training_key"]
