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
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trainpipe.components.train_model.spec import (
    NAME,
    TrainModelConfig,
    TrainModelResult,
)
from trainpipe.contract import errors
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_settings, file_digest
from trainpipe.contract.layout import (
    CHECKPOINT_DIR,
    EPOCH_METRICS_FILE,
    ERRORS_DIR,
    MODEL_FILE,
    MODEL_META,
    TELEMETRY_DIR,
)
from trainpipe.contract.lineage import Lineage, SnapshotLineage, TrainingLineage
from trainpipe.contract.policy import Policy
from trainpipe.contract.runtime import Runtime
from trainpipe.contract.text import redact
from trainpipe.data.tabular import find_dataset
from trainpipe.services import telemetry
from trainpipe.services.costs import Budget, Meter, record_spent, spent_before
from trainpipe.services.profiles import metrics_port, prices_of, profile_name
from trainpipe.services.tracking import PARENT_RUN_ENV, RUN_NAME_ENV
from trainpipe.training import launch
from trainpipe.training.control import PREEMPT_SIGNALS
from trainpipe.training.faults import Fault
from trainpipe.training.metrics import diverged_at
from trainpipe.training.preflight import check_inputs, rank_env


class _Tracking(threading.Thread):
    """Opens (or reuses) the MLflow run while the ranks start and train."""

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
            self.run_id, reused = _training_run(self.client, self.exp_id, c, snapshot, orchestrator_run)
            self.finished = reused and self.client.get_run(self.run_id).info.status == "FINISHED"
            _remember_run(c, self.run_id, self.exp_id, _training_key(c, snapshot))
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
    with _PlatformStop() as stop:
        try:
            return _train_here(config, lineage, runtime, spending, stop)
        except _Stopped as exc:
            raise _stopped(config, stop, exc.signal) from None


def _train_here(
    config: TrainModelConfig, lineage: Lineage, runtime: Runtime, spending: _Spending, stop: _PlatformStop
) -> TrainModelResult:
    """Start this node's ranks, wait for them, and (node 0) log what they made."""
    out = Path(config.output_dir)
    chief = launch.node_rank(config) == 0
    shutil.rmtree(out / ERRORS_DIR, ignore_errors=True)
    if chief:
        from trainpipe.services import tracking

        tracking.probe(
            config.tracking_uri, runtime.policy
        )  # scheme and TLS, and a server that is down: exit 75 before any rank starts
    tracking_thread = _Tracking(config, lineage, runtime.policy) if chief else None
    stop.tracking = tracking_thread
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
        profile_name(runtime.hardware_profile),
        config.train_function,
    )
    spending.start()
    stop.when = "after its ranks' last step, before the model was logged"  # the launcher has the signals till then
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
        stop.failure = _rank_failure(out)  # read before _failed discards it: a stop while failing keeps it
        _failed(config, out, code, rank_errors, tracking_thread, spending.reason)
    if tracking_thread is None:
        return _worker_node_result(config, spending.training_wall or 0.0, lineage)
    Fault.from_env().after_training()  # fault injection (tests): the platform's stop, just after the last step
    t = tracking_thread.result()
    return _report(config, lineage, t, out, spending, runtime.hardware_profile)


class _Stopped(BaseException):
    """The platform's stop signal, raised where the step was (no rank running): see :class:`_PlatformStop`."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal = signal_name


class _PlatformStop:
    """The platform's stop (SIGTERM: a pod deleted, a preemption; SIGUSR1: Slurm's warning) while no rank
    trains: before the ranks start, or once they finished while the step logs the model. It ends the step
    at once, exit 75 and one line, its MLflow run marked KILLED (never left RUNNING) and its checkpoints
    kept, so the retry resumes (after the last step: it only logs the model). While the ranks run the
    launcher handles these signals, and passes on to this one a signal the ranks finished before acting on."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.tracking: _Tracking | None = None
        self.when = "before its ranks started"
        #: A rank's own error, once the step is failing on it (a stop then changes nothing of that).
        self.failure: errors.TrainpipeError | None = None
        self._previous: dict[str, Any] = {}

    def __enter__(self) -> _PlatformStop:
        if threading.current_thread() is threading.main_thread():
            for name in PREEMPT_SIGNALS:
                self._previous[name] = signal.signal(getattr(signal, name), self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, handler in self._previous.items():
            signal.signal(getattr(signal, name), handler)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.signal is None:  # one stop: a second signal while it stops changes nothing
            self.signal = signal.Signals(signum).name
            raise _Stopped(self.signal)


def _rank_failure(out: Path) -> errors.TrainpipeError | None:
    """A rank's own error, recorded before a stop came: what the step failed on (a retry would fail again)."""
    folder = out / ERRORS_DIR
    for path in sorted(folder.glob("rank*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            err = json.loads(path.read_text(encoding="utf-8"))
            if err.get("type") not in ("Preempted", "BudgetReached"):
                return getattr(errors, err.get("type", ""), errors.TrainpipeError)(err.get("message", "a rank failed"))
    return None


def _stopped(config: TrainModelConfig, stop: _PlatformStop, signal_name: str) -> errors.TrainpipeError:
    """The step stopped on the platform's signal outside its ranks' training: nothing half-made is left, the
    run is KILLED, and the one line says where a retry resumes. A rank that failed before the signal came
    (a bad label column) is the step's error instead: exit 2, not a retry that fails again."""
    from trainpipe.training.checkpoint import checkpoint_name, completed_checkpoints

    out = Path(config.output_dir)
    failure = stop.failure or _rank_failure(out)
    _discard_outputs(out)
    (out / f".train_config.node{launch.node_rank(config)}.json").unlink(missing_ok=True)
    t = stop.tracking
    if t is not None:
        t.join()
        if t.client is not None and t.run_id and not t.finished:
            with contextlib.suppress(Exception):  # the line below is what matters now
                t.client.set_terminated(t.run_id, status="KILLED" if failure is None else "FAILED")
    if failure is not None:
        return failure
    done = completed_checkpoints(_checkpoint_dir(config))
    step = int(done[-1].name.split("-")[1]) if done else None
    kept = f"a retry resumes from {checkpoint_name(step)}" if step is not None else "a retry starts over"
    return errors.Preempted(f"preempted by {signal_name} {stop.when}: {kept}", step=step)


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
        if tracking_thread.client is not None and tracking_thread.run_id and not tracking_thread.finished:
            tracking_thread.client.set_terminated(tracking_thread.run_id, status="KILLED" if preempted else "FAILED")
    if budget is not None and preempted:
        raise errors.BudgetReached(f"{budget}; {_where_stopped(err)}")
    if err is not None and err.get("detail"):  # the team's whole error, for the log; the one line follows
        print(f"train_model: {config.train_function} raised (its whole error):\n{err['detail']}", file=sys.stderr)
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


#: Which rerun resumes: a pipeline engine gives each run its own output folder (a new run starts over there).
SAME = " (on the same checkpoints: the same output_dir, or a checkpoint_dir the runs share)"


def _where_stopped(err: dict[str, Any] | None) -> str:
    """Where a budget's stop left the training, from the ranks' record of it (the step, the checkpoint)."""
    step, ckpt = (err or {}).get("step"), (err or {}).get("checkpoint")
    if ckpt:
        return f"stopped at step {step} with a checkpoint: a rerun with a larger budget resumes from {ckpt}{SAME}"
    if err is None:  # the ranks were stopped before they could say where
        return f"stopped: a rerun with a larger budget resumes from the newest checkpoint, if one was written{SAME}"
    return f"stopped at step {step or 0}: no checkpoint was written, so a rerun with a larger budget starts over"


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
    checkpoints) and this one: its ranks, measured while they run, and this process's own CPU (its
    start-up, the MLflow run opened beside the ranks, logging the model after them).

    Raises:
        InputError: max_cost on a hardware profile without prices.
        BudgetReached: earlier attempts already spent the budget (nothing starts).
    """

    def __init__(self, config: TrainModelConfig, hardware_profile: str) -> None:
        self.prices = prices_of(hardware_profile)
        if config.max_cost is not None and self.prices is None:
            raise InputError(
                f"max_cost: the hardware profile {profile_name(hardware_profile)!r} declares no prices (give it "
                "prices:, or set max_gpu_hours)"
            )
        self.dir = Path(config.checkpoint_dir or Path(config.output_dir) / CHECKPOINT_DIR)
        self.before = spent_before(self.dir)
        limited = config.max_cost is not None or config.max_gpu_hours is not None
        self.budget = Budget(config.max_cost, config.max_gpu_hours, self.prices) if limited else None
        self.gpus = config.nproc_per_node if _uses_cuda(config) else 0
        self.reason: str | None = None
        if self.budget is not None and self.before is not None and (said := self.budget.reached(self.before)):
            raise errors.BudgetReached(f"{said}; nothing started: a rerun with a larger budget resumes{SAME}")
        self.meter = Meter()

    def start(self) -> None:
        """The ranks start now: this attempt's wall time is measured from here (its own CPU from its start)."""
        self.meter = Meter(whole_process=True)
        self.training_wall: float | None = None

    def spent(self) -> bool:
        """Whether the budget is spent (the launcher asks once a second)."""
        assert self.budget is not None
        self.reason = self.budget.reached(self.meter.live(self.gpus) + self.before)
        return self.reason is not None

    def record(self) -> None:
        """What this attempt used so far (``this``) and every attempt so far (``total``, kept beside the
        checkpoints). The first record, as the ranks end, also fixes the training's wall time."""
        self.this = self.meter.usage(self.gpus)
        self.total = self.this + self.before
        if self.training_wall is None:
            self.training_wall = self.this.wall_seconds
        record_spent(self.dir, self.total)


def with_tuned(config: TrainModelConfig) -> TrainModelConfig:
    """The settings with tune_model's best trial's applied over them (its ``tuned`` output), checked again
    (the entrypoint lays them over the flags before it checks them; a core called directly, here).

    Raises:
        InputError: the artifact has no best settings, or they do not fit train_model.
    """
    if not config.tuned:
        return config
    from trainpipe.contract.config import build
    from trainpipe.contract.entrypoint import lay_settings

    merged = {**lay_settings(TrainModelConfig, config.model_dump(exclude_unset=True)), "tuned": None}
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
    from trainpipe.services.serving.package import INPUT_EXAMPLE_FILE, OUTPUT_EXAMPLE_FILE

    for name in (ERRORS_DIR, TELEMETRY_DIR):
        shutil.rmtree(out / name, ignore_errors=True)
    from trainpipe.training.weights_file import DIGEST_SUFFIX

    for name in (MODEL_FILE, MODEL_META, EPOCH_METRICS_FILE, INPUT_EXAMPLE_FILE, OUTPUT_EXAMPLE_FILE):
        (out / name).unlink(missing_ok=True)
    (out / f"{MODEL_FILE}{DIGEST_SUFFIX}").unlink(missing_ok=True)


def _report(
    config: TrainModelConfig,
    lineage: Lineage,
    t: _Tracking,
    out: Path,
    spending: _Spending,
    hardware_profile: str,
) -> TrainModelResult:
    """Log what the ranks made, what they used and what that cost to the run, and build the result."""
    meta = json.loads((out / MODEL_META).read_text(encoding="utf-8"))
    wall = spending.training_wall or 0.0
    history = [
        json.loads(line) for line in (out / EPOCH_METRICS_FILE).read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    last = {
        k: float(v)
        for k, v in (history[-1] if history else {}).items()
        if k not in ("epoch", "step") and isinstance(v, (int, float))
    }
    sha, model_uri, usage, spent = _log_run(config, t, out, spending, history, wall)
    result = _result(config, t, out, meta, last, wall, sha, model_uri, usage, spent, spending.prices)
    result.diverged_at_epoch = diverged_at(history)  # the loss went NaN or infinite there: the result says so
    result.lineage = lineage.with_(
        training=TrainingLineage(
            mlflow_run_id=t.run_id,
            experiment_id=t.exp_id,
            model_uri=model_uri,
            train_function=config.train_function,
            task=config.task,
            backend=config.backend,
            dist_backend=result.dist_backend,
            device=result.device,
            world_size=result.world_size,
            precision=config.precision,
            hardware_profile=profile_name(hardware_profile),
            model_sha256=sha,
            final_loss=round(result.final_loss, 6) if result.final_loss is not None else None,
            **usage.model_dump(exclude={"nodes"}),  # what every attempt used, as the result says
            cost=result.cost,
            currency=result.currency,
        )
    )
    return result


def _log_run(
    config: TrainModelConfig,
    t: _Tracking,
    out: Path,
    spending: _Spending,
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
        sha = _model_digest(out)
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


def _model_digest(out: Path) -> str:
    """The weights file's sha256: the one its writer took of the bytes as it wrote them, kept beside the file for
    that very file (inode, size, mtime); else read and hashed here (a 4 GB model is seconds of reading)."""
    from trainpipe.training.weights_file import recorded_digest

    return recorded_digest(out / MODEL_FILE) or file_digest(out / MODEL_FILE, "sha256")


def _result(
    config: TrainModelConfig,
    t: _Tracking,
    out: Path,
    meta: dict[str, Any],
    last: dict[str, float],
    wall: float,
    sha: str,
    model_uri: str,
    usage: Any,
    spent: dict[str, float],
    prices: Any,
) -> TrainModelResult:
    """The step's result from the model's description, the last epoch's means and rank 0's telemetry."""
    telemetry0 = json.loads((out / TELEMETRY_DIR / "rank0.json").read_text(encoding="utf-8"))
    return TrainModelResult(
        model_file=MODEL_FILE,
        model_sha256=sha,
        model_uri=model_uri,
        mlflow_run_id=t.run_id,
        tracking_uri=redact(t.uri),
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


#: Beside the checkpoints: the MLflow run of the training they hold (its id, experiment and the training's key).
RUN_FILE = "mlflow_run.json"


def _training_key(config: TrainModelConfig, snapshot: SnapshotLineage | None) -> str:
    """What makes two trainings the same: the data's content and every setting but where things are written."""
    settings = json.dumps(
        config.model_dump(mode="json", exclude={"output_dir", "checkpoint_dir", "tracking_uri"}), sort_keys=True
    )
    return hashlib.sha256(f"{snapshot.md5 if snapshot else ''}|{settings}".encode()).hexdigest()


def _checkpoint_dir(config: TrainModelConfig) -> Path:
    return Path(config.checkpoint_dir or Path(config.output_dir) / CHECKPOINT_DIR)


def _remember_run(config: TrainModelConfig, run_id: str, exp_id: str, key: str) -> None:
    """Keep the training's MLflow run beside its checkpoints: a rerun that resumes from them continues that run."""
    from trainpipe.contract.io import atomic_write_json

    folder = _checkpoint_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / RUN_FILE, {"run_id": run_id, "experiment_id": exp_id, "key": key})


def _remembered_run(client: Any, exp_id: str, config: TrainModelConfig, key: str) -> Any:
    """The run kept beside the checkpoints, when it is this training's (same data and settings) in this
    experiment and still there; else None."""
    try:
        kept = json.loads((_checkpoint_dir(config) / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key or kept.get("experiment_id") != exp_id:
        return None
    try:
        run = client.get_run(str(kept.get("run_id")))
    except Exception:  # noqa: BLE001 (deleted, or another server's: a new run is made)
        return None
    return run if run.info.lifecycle_stage == "active" else None


def _training_run(
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
    local = _training_key(config, snapshot)
    key = hashlib.sha256(f"{orchestrator_run}|{local}".encode()).hexdigest()
    if orchestrator_run:
        found = client.search_runs([exp_id], filter_string=f"tags.`trainpipe.attempt_key` = '{key}'", max_results=1)
        if found:
            if found[0].info.status != "FINISHED":
                client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id, True
    kept = _remembered_run(client, exp_id, config, local)
    if kept is not None:
        if kept.info.status != "FINISHED":
            client.update_run(kept.info.run_id, status="RUNNING")
        return kept.info.run_id, True
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
