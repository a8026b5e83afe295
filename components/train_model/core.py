"""train_model: the launcher. Checks what can be checked cheaply, starts this node's ranks (each
runs the training function on :mod:`trainpipe.training`'s context) while it opens the MLflow run
on a thread, then logs what the ranks made: metrics, the weights-only artifact and the MLflow
pyfunc model. No ML framework is imported here: only in the ranks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from trainpipe import telemetry
from trainpipe.components.train_model.spec import (
    NAME,
    TrainModelConfig,
    TrainModelResult,
)
from trainpipe.contract import errors
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_settings, file_digest
from trainpipe.contract.lineage import Lineage, SnapshotLineage, TrainingLineage
from trainpipe.contract.policy import Policy
from trainpipe.contract.runtime import Runtime
from trainpipe.costs import Budget, Meter, record_spent, spent_before
from trainpipe.layout import (
    CHECKPOINT_DIR,
    EPOCH_METRICS_FILE,
    ERRORS_DIR,
    MODEL_FILE,
    MODEL_META,
    TELEMETRY_DIR,
    TUNED_SETTINGS_FILE,
)
from trainpipe.profiles import metrics_port, prices_of
from trainpipe.tabular import find_dataset
from trainpipe.tracking import PARENT_RUN_ENV, RUN_NAME_ENV
from trainpipe.training import launch
from trainpipe.training.preflight import check_inputs, rank_env


class _Tracking(threading.Thread):
    """Opens (or reuses) the MLflow run while the ranks start and train."""

    def __init__(self, config: TrainModelConfig, lineage: Lineage, policy: Policy) -> None:
        super().__init__(name="trainpipe-mlflow", daemon=True)
        self.config, self.lineage, self.policy = config, lineage, policy
        self.client: Any = None
        self.run_id = self.exp_id = self.uri = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        # the ranks come first: this thread (imports, the run, the store) takes the cores they leave
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            from trainpipe import tracking

            c = self.config
            self.client = tracking.connect(c.tracking_uri, self.policy)
            self.uri = tracking.resolve_tracking_uri(c.tracking_uri, self.policy)
            self.exp_id = tracking.ensure_experiment(self.client, c.experiment_name, self.uri)
            tracking.prepare_artifact_store(self.client, self.policy, experiment_id=self.exp_id)
            snapshot = self.lineage.snapshot
            orchestrator_run = self.lineage.orchestrator.run_id if self.lineage.orchestrator else ""
            self.run_id, reused = _training_run(self.client, self.exp_id, c, snapshot, orchestrator_run)
            if not reused:
                _log_params_and_input(self.client, self.run_id, c, snapshot)
            # what logging the model needs once the ranks are done, imported while they train (on a
            # busy machine the import shares the cores; after training it would add to the wall time)
            import mlflow.models  # noqa: F401
            import mlflow.pyfunc  # noqa: F401
        except BaseException as exc:  # raised in the launcher's thread by result()
            self.error = exc

    def result(self) -> _Tracking:
        self.join()
        if self.error is not None:
            raise self.error
        return self


def train_model(config: TrainModelConfig, lineage: Lineage, runtime: Runtime | None = None) -> TrainModelResult:
    """Train with the configured function and backend, and log the run and the model to MLflow.

    On a multi-node job every node runs this; node 0 alone opens the MLflow run and reports the
    model, the other nodes only run their ranks.

    Args:
        config: Settings and paths.
        lineage: The lineage so far; ``training`` is added.
        runtime: The platform's settings: the tracking server and artifact store are checked
            against its policy, and its hardware profile is recorded.

    Returns:
        The model's hash, the MLflow run and model URI, and the training figures.

    Raises:
        InputError: bad data, settings or training function (also when a rank reports one).
        ServiceUnavailable: MLflow cannot be reached.
        TrainpipeError: the ranks failed beyond ``max_restarts``.
    """
    runtime = runtime or Runtime()
    lineage = Lineage.of(lineage)
    config = with_tuned(config)
    find_dataset(config.data, "data")
    if config.slurm is not None or (config.cluster is not None and config.nnodes > 1):
        return _as_job(config, lineage, runtime)
    check_inputs(config)
    spending = _Spending(config, runtime.hardware_profile)  # what it spends, against its budget
    out = Path(config.output_dir)
    chief = launch.node_rank(config) == 0
    shutil.rmtree(out / ERRORS_DIR, ignore_errors=True)
    if chief:
        from trainpipe import tracking

        tracking.probe(
            config.tracking_uri, runtime.policy
        )  # scheme and TLS, and a server that is down: exit 75 before any rank starts
    tracking_thread = _Tracking(config, lineage, runtime.policy) if chief else None
    if tracking_thread is not None:
        tracking_thread.start()
    config_path = out / f".train_config.node{launch.node_rank(config)}.json"
    if config.metrics_port is None:
        config = config.model_copy(update={"metrics_port": metrics_port(runtime.hardware_profile)})
    atomic_write_settings(config_path, config)
    env = rank_env(config)
    env[telemetry.LABELS_ENV] = telemetry.training_labels(
        lineage.orchestrator.run_id
        if lineage.orchestrator and lineage.orchestrator.run_id
        else f"local-{hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:8]}",
        runtime.hardware_profile,
        config.train_function,
    )
    spending.start()
    try:
        abort = (lambda: tracking_thread.error is not None) if tracking_thread is not None else None
        budget = spending.spent if spending.budget is not None else None
        code = launch.launch(config, config_path, env, out / ERRORS_DIR, abort=abort, budget=budget)
    finally:
        config_path.unlink(missing_ok=True)
        shutil.rmtree(out / launch.RENDEZVOUS_DIR, ignore_errors=True)
        spending.record()
    if (
        tracking_thread is not None and tracking_thread.error is not None and code != 0
    ):  # MLflow failed: the ranks were stopped
        _discard_outputs(out)
        tracking_thread.result()
    rank_errors = sorted((out / ERRORS_DIR).glob("rank*.json")) if (out / ERRORS_DIR).exists() else []
    if code != 0 or rank_errors:
        _failed(config, out, code, rank_errors, tracking_thread, spending.reason)
    if tracking_thread is None:
        return _worker_node_result(config, spending.this.wall_seconds, lineage)
    t = tracking_thread.result()
    return _report(config, lineage, t, out, spending, runtime.hardware_profile)


def _failed(
    config: TrainModelConfig, out: Path, code: int, rank_errors: list[Path], tracking_thread: Any, budget: str | None
) -> None:
    """Why the ranks failed, as the error the entrypoint turns into its exit code and one line; the run
    marked failed (or killed: preempted, or stopped by its budget)."""
    err = json.loads(rank_errors[0].read_text(encoding="utf-8")) if rank_errors else None
    preempted = code == errors.EXIT_TRANSIENT and (err is None or err.get("type") == "Preempted")
    _discard_outputs(out)  # the checkpoints stay: a rerun resumes from them
    if tracking_thread is not None:
        tracking_thread.join()
        if tracking_thread.client is not None and tracking_thread.run_id:
            tracking_thread.client.set_terminated(tracking_thread.run_id, status="KILLED" if preempted else "FAILED")
    if budget is not None and preempted:
        import re

        said = (err or {}).get("message", "")
        step, ckpt = re.search(r"at step (\d+)", said), re.search(r"ckpt-\d+", said)
        where = f"stopped at step {step[1]} with a checkpoint" if step else "stopped"
        resume = ckpt[0] if ckpt else "its newest checkpoint"
        raise errors.BudgetReached(f"{budget}; {where}: a rerun with a larger budget resumes from {resume}")
    if err is not None:
        raise getattr(errors, err.get("type", ""), errors.TrainpipeError)(err.get("message", "a rank failed"))
    if preempted:
        raise errors.Preempted(
            "preempted: the ranks stopped before writing a checkpoint; a retry resumes from the newest one"
        )
    raise errors.TrainpipeError(
        f"training failed: the {config.backend} ranks exited with {code} after up to {config.max_restarts} "
        "restarts (rank logs above)"
    )


def _uses_cuda(config: TrainModelConfig) -> bool:
    """Whether the ranks will train on GPUs (what ``device: auto`` picks), without importing torch."""
    if config.device != "auto":
        return config.device == "cuda"
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


class _Spending:
    """What this training spends, against its budget: every earlier attempt (the record beside its
    checkpoints) and this one, measured while its ranks run.

    Raises:
        InputError: max_cost on a hardware profile without prices.
        BudgetReached: earlier attempts already spent the budget (nothing starts).
    """

    def __init__(self, config: TrainModelConfig, hardware_profile: str) -> None:
        self.prices = prices_of(hardware_profile)
        if config.max_cost is not None and self.prices is None:
            raise InputError(
                f"max_cost: the hardware profile {hardware_profile!r} declares no prices (give it prices:, or set "
                "max_gpu_hours)"
            )
        self.dir = Path(config.checkpoint_dir or Path(config.output_dir) / CHECKPOINT_DIR)
        self.before = spent_before(self.dir)
        limited = config.max_cost is not None or config.max_gpu_hours is not None
        self.budget = Budget(config.max_cost, config.max_gpu_hours, self.prices) if limited else None
        self.gpus = config.nproc_per_node if _uses_cuda(config) else 0
        self.reason: str | None = None
        if self.budget is not None and self.before is not None and (said := self.budget.reached(self.before)):
            raise errors.BudgetReached(f"{said}; nothing started: a rerun with a larger budget resumes")
        self.meter = Meter()

    def start(self) -> None:
        """The ranks start now: this attempt is measured from here."""
        self.meter = Meter()

    def spent(self) -> bool:
        """Whether the budget is spent (the launcher asks once a second)."""
        assert self.budget is not None
        self.reason = self.budget.reached(self.meter.live(self.gpus) + self.before)
        return self.reason is not None

    def record(self) -> None:
        """What this attempt used (``this``) and every attempt so far (``total``, kept beside the checkpoints)."""
        self.this = self.meter.usage(self.gpus)
        self.total = self.this + self.before
        record_spent(self.dir, self.total)


def with_tuned(config: TrainModelConfig) -> TrainModelConfig:
    """The settings with tune_model's best trial's applied over them (its ``tuned`` output), checked again.

    Raises:
        InputError: the artifact has no best settings, or they do not fit train_model.
    """
    if not config.tuned:
        return config
    from trainpipe.contract.config import build

    path = Path(config.tuned) / TUNED_SETTINGS_FILE
    try:
        best = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InputError(f"tuned: {str(path)!r} is missing or not JSON (is it tune_model's output?)") from None
    if not best:
        raise InputError(f"tuned: {str(path)!r} holds no settings: the study completed no trial")
    merged = {**config.model_dump(exclude_unset=True), **best, "tuned": None}
    return build(TrainModelConfig, merged, where="tuned")


def _as_job(config: TrainModelConfig, lineage: Lineage, runtime: Runtime) -> TrainModelResult:
    """The training as a scheduler's job (Slurm; a Kubernetes TrainJob or PyTorchJob): this step waits.
    The training function is imported and checked here first: a typo fails in a second, not after queueing."""
    from trainpipe.training.preflight import check_function

    check_function(config)
    if config.slurm is not None:
        from trainpipe.components.train_model.slurm_job import run_slurm_job

        return run_slurm_job(config, lineage, runtime)
    from trainpipe.components.train_model.k8s import run_cluster_job

    return run_cluster_job(config, lineage, runtime)


def _discard_outputs(out: Path) -> None:
    """What a failed run wrote besides its checkpoints: no half-made model is left to be read."""
    from trainpipe.serving.package import INPUT_EXAMPLE_FILE, OUTPUT_EXAMPLE_FILE

    for name in (ERRORS_DIR, TELEMETRY_DIR):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (MODEL_FILE, MODEL_META, EPOCH_METRICS_FILE, INPUT_EXAMPLE_FILE, OUTPUT_EXAMPLE_FILE):
        (out / name).unlink(missing_ok=True)


def _report(
    config: TrainModelConfig,
    lineage: Lineage,
    t: _Tracking,
    out: Path,
    spending: _Spending,
    hardware_profile: str,
) -> TrainModelResult:
    """Log what the ranks made, what they used and what that cost to the run, and build the result."""
    from mlflow.entities import Metric

    from trainpipe import tracking
    from trainpipe.serving import package

    client, run_id = t.client, t.run_id
    meta = json.loads((out / MODEL_META).read_text(encoding="utf-8"))
    wall, usage, prices = spending.this.wall_seconds, spending.total, spending.prices
    spent = usage.figures(prices)
    history = [
        json.loads(line) for line in (out / EPOCH_METRICS_FILE).read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    last = {
        k: float(v)
        for k, v in (history[-1] if history else {}).items()
        if k not in ("epoch", "step") and isinstance(v, (int, float))
    }
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
        for key, value in spent.items():
            client.log_metric(run_id, f"train_{key}", value)
        if prices is not None:
            client.set_tag(run_id, "trainpipe.cost_currency", prices.currency)
        for name in (MODEL_META, EPOCH_METRICS_FILE):
            client.log_artifact(run_id, str(out / name), artifact_path="train_model")
        model_uri = package.log_model(run_id, out, config.serving_requirements)
        sha = file_digest(out / MODEL_FILE, "sha256")
        client.set_tag(run_id, "trainpipe.model_sha256", sha)
        client.set_tag(run_id, "trainpipe.model_uri", model_uri)
        client.set_terminated(run_id, status="FINISHED")
    except errors.TrainpipeError:
        raise
    except Exception as exc:
        raise tracking.classify(
            exc, f"tracking_uri: logging the training run to {tracking.redact(t.uri)!r}", "failed"
        ) from None
    telemetry0 = json.loads((out / TELEMETRY_DIR / "rank0.json").read_text(encoding="utf-8"))
    result = TrainModelResult(
        model_file=MODEL_FILE,
        model_sha256=sha,
        model_uri=model_uri,
        mlflow_run_id=run_id,
        tracking_uri=tracking.redact(t.uri),
        experiment_id=t.exp_id,
        train_function=config.train_function,
        task=config.task,
        backend=config.backend,
        dist_backend=meta["dist_backend"],
        device=meta["device"],
        world_size=int(meta["world_size"]),
        epochs=config.epochs,
        final_loss=last.get("loss"),
        metrics=last,
        wall_seconds=round(wall, 3),
        usage=usage,
        cost=spent.get("cost"),
        currency=prices.currency if prices is not None else None,
        resumed_from_step=int(telemetry0.get("resumed_from_step", 0)),
        global_steps=int(telemetry0.get("global_steps", 0)),
        precision=config.precision,
        classes=meta.get("classes", []),
        feature_columns=meta["feature_columns"],
    )
    result.lineage = lineage.with_(
        training=TrainingLineage(
            mlflow_run_id=run_id,
            experiment_id=t.exp_id,
            model_uri=model_uri,
            train_function=config.train_function,
            task=config.task,
            backend=config.backend,
            dist_backend=result.dist_backend,
            device=result.device,
            world_size=result.world_size,
            precision=config.precision,
            hardware_profile=hardware_profile,
            model_sha256=sha,
            final_loss=round(result.final_loss, 6) if result.final_loss is not None else None,
            **usage.model_dump(exclude={"nodes"}),  # what every attempt used, as the result says
            cost=result.cost,
            currency=result.currency,
        )
    )
    return result


def _training_run(
    client: Any, exp_id: str, config: TrainModelConfig, snapshot: SnapshotLineage | None, orchestrator_run: str
) -> tuple[str, bool]:
    """The MLflow run of this training: a retry of the same orchestrator run on the same data and
    settings reuses the run its earlier attempt opened, so a retried task makes no duplicate run.

    Returns:
        The run id, and whether it was reused.
    """
    import hashlib

    settings = json.dumps(
        config.model_dump(mode="json", exclude={"output_dir", "checkpoint_dir", "tracking_uri"}), sort_keys=True
    )
    md5 = snapshot.md5 if snapshot else ""
    key = hashlib.sha256(f"{orchestrator_run}|{md5}|{settings}".encode()).hexdigest()
    if orchestrator_run:
        found = client.search_runs([exp_id], filter_string=f"tags.`trainpipe.attempt_key` = '{key}'", max_results=1)
        if found:
            client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id, True
    run = client.create_run(
        exp_id,
        tags={
            "mlflow.runName": os.environ.get(RUN_NAME_ENV) or f"train-{(md5 or 'data')[:8]}",
            "trainpipe.component": NAME,
            "trainpipe.train_function": config.train_function,
            "trainpipe.dataset_md5": md5,
            "trainpipe.orchestrator_run_id": orchestrator_run,
            "trainpipe.attempt_key": key,
            **({"mlflow.parentRunId": os.environ[PARENT_RUN_ENV]} if os.environ.get(PARENT_RUN_ENV) else {}),
        },
    )
    return run.info.run_id, False


def _log_params_and_input(client: Any, run_id: str, config: TrainModelConfig, snapshot: SnapshotLineage | None) -> None:
    """The settings as params, and the snapshot as the run's training input (name, content hash,
    source and columns: read from the file's header or footer, never the whole table)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag, Param

    from trainpipe.tabular import dataset_columns

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


def _worker_node_result(config: TrainModelConfig, wall: float, lineage: Lineage) -> TrainModelResult:
    """A non-chief node's result: its ranks ran; node 0 reports the model."""
    return TrainModelResult(
        model_file="",
        model_sha256="",
        mlflow_run_id="",
        tracking_uri="",
        experiment_id="",
        train_function=config.train_function,
        task=config.task,
        backend=config.backend,
        dist_backend="",
        device="",
        world_size=config.world_size,
        epochs=config.epochs,
        wall_seconds=round(wall, 3),
        resumed_from_step=0,
        global_steps=0,
        precision=config.precision,
        classes=[],
        feature_columns=[],
        lineage=lineage,
    )


__all__ = ["NAME", "train_model"]
