"""train_model: the component's flow. Checks what can be checked cheaply, starts this node's ranks (each
runs the training function on :mod:`trainpipe.training`'s context) while it opens the MLflow run
on a thread, then logs what the ranks made: metrics, the weights-only artifact and the MLflow
pyfunc model. No ML framework is imported here: only in the ranks.

Its jobs live beside their kin in the library: the MLflow run's thread and its logging in
:mod:`trainpipe.training.tracking_run`, the platform's stop while no rank trains in
:mod:`trainpipe.training.control`, the budget in :mod:`trainpipe.services.costs`, the launchers in
:mod:`trainpipe.training.launch` (this node's ranks) and beside this file (``slurm_job``, ``k8s``: a
scheduler's job); what a node reports in ``node_result``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sys
from pathlib import Path

from trainpipe.components.train_model import node_result
from trainpipe.components.train_model.spec import NAME, TrainModelConfig, TrainModelResult
from trainpipe.contract import errors
from trainpipe.contract.io import atomic_write_settings
from trainpipe.contract.layout import EPOCH_METRICS_FILE, ERRORS_DIR, MODEL_META
from trainpipe.contract.lineage import Lineage, TrainingLineage
from trainpipe.contract.runtime import Runtime
from trainpipe.data.tabular import find_dataset
from trainpipe.services import telemetry
from trainpipe.services.costs import Spending, where_stopped
from trainpipe.services.profiles import metrics_port, prices_of, profile_name
from trainpipe.training import launch
from trainpipe.training.backends import uses_cuda
from trainpipe.training.checkpoint import discard_outputs
from trainpipe.training.control import PlatformStop, Stopped, rank_error, rank_failure
from trainpipe.training.faults import Fault
from trainpipe.training.metrics import diverged_at
from trainpipe.training.preflight import check_inputs, rank_env
from trainpipe.training.tracking_run import TrackingThread, log_training


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
    spending = spending_of(config, runtime.hardware_profile)  # what it spends, against its budget
    with PlatformStop() as stop:
        try:
            return _train_here(config, lineage, runtime, spending, stop)
        except Stopped as exc:
            raise _stopped(config, stop, exc.signal) from None


def _train_here(
    config: TrainModelConfig, lineage: Lineage, runtime: Runtime, spending: Spending, stop: PlatformStop
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
    tracking_thread = TrackingThread(config, lineage, runtime.policy) if chief else None
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
        discard_outputs(out)
        tracking_thread.result()
    rank_errors = sorted((out / ERRORS_DIR).glob("rank*.json")) if (out / ERRORS_DIR).exists() else []
    if code != 0 or rank_errors:
        stop.failure = rank_failure(out / ERRORS_DIR)  # read before _failed discards it: a stop while failing keeps it
        _failed(config, out, code, rank_errors, tracking_thread, spending.reason)
    if tracking_thread is None:
        return node_result.worker(config, spending.training_wall or 0.0, lineage)
    Fault.from_env().after_training()  # fault injection (tests): the platform's stop, just after the last step
    t = tracking_thread.result()
    return _report(config, lineage, t, out, spending, runtime.hardware_profile)


def _stopped(config: TrainModelConfig, stop: PlatformStop, signal_name: str) -> errors.TrainpipeError:
    """The step stopped on the platform's signal outside its ranks' training: nothing half-made is left, the
    run is KILLED, and the one line says where a retry resumes. A rank that failed before the signal came
    (a bad label column) is the step's error instead: exit 2, not a retry that fails again."""
    from trainpipe.training.checkpoint import checkpoint_name, completed_checkpoints

    out = Path(config.output_dir)
    failure = stop.failure or rank_failure(out / ERRORS_DIR)
    discard_outputs(out)
    (out / f".train_config.node{launch.node_rank(config)}.json").unlink(missing_ok=True)
    if stop.tracking is not None:
        with contextlib.suppress(Exception):  # the line below is what matters now
            stop.tracking.end("KILLED" if failure is None else "FAILED")
    if failure is not None:
        return failure
    done = completed_checkpoints(config.checkpoint_folder)
    step = int(done[-1].name.split("-")[1]) if done else None
    kept = f"a retry resumes from {checkpoint_name(step)}" if step is not None else "a retry starts over"
    return errors.Preempted(f"preempted by {signal_name} {stop.when}: {kept}", step=step)


def _failed(
    config: TrainModelConfig,
    out: Path,
    code: int,
    rank_errors: list[Path],
    tracking_thread: TrackingThread | None,
    budget: str | None,
) -> None:
    """Why the ranks failed, as the error the entrypoint turns into its exit code and one line; the run
    marked failed (or killed: preempted, or stopped by its budget)."""
    err = json.loads(rank_errors[0].read_text(encoding="utf-8")) if rank_errors else None
    preempted = code == errors.EXIT_TRANSIENT and (err is None or err.get("type") == "Preempted")
    discard_outputs(out)  # the checkpoints stay: a rerun resumes from them
    if tracking_thread is not None:
        tracking_thread.end("KILLED" if preempted else "FAILED")
    if budget is not None and preempted:
        raise errors.BudgetReached(f"{budget}; {where_stopped(err)}")
    if err is not None and err.get("detail"):  # the team's whole error, for the log; the one line follows
        print(f"train_model: {config.train_function} raised (its whole error):\n{err['detail']}", file=sys.stderr)
    if err is not None:
        raise rank_error(err)
    if preempted:
        raise errors.Preempted(
            "preempted: the ranks stopped before writing a checkpoint; a retry resumes from the newest one"
        )
    raise errors.TrainpipeError(
        f"training failed: the {config.backend} ranks exited with {code} after up to {config.max_restarts} "
        "restarts (rank logs above)"
    )


def spending_of(config: TrainModelConfig, hardware_profile: str) -> Spending:
    """What the training spends against its budget (:class:`trainpipe.services.costs.Spending`), from its settings.

    Raises:
        InputError: max_cost on a hardware profile without prices.
        BudgetReached: earlier attempts already spent the budget (nothing starts).
    """
    return Spending(
        config.checkpoint_folder,
        prices_of(hardware_profile),
        profile=profile_name(hardware_profile),
        max_cost=config.max_cost,
        max_gpu_hours=config.max_gpu_hours,
        gpus=config.nproc_per_node if uses_cuda(config.device) else 0,
    )


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


def _report(
    config: TrainModelConfig,
    lineage: Lineage,
    t: TrackingThread,
    out: Path,
    spending: Spending,
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
    sha, model_uri, usage, spent = log_training(config, t, out, spending, history, wall)
    result = node_result.chief(config, t, out, meta, last, wall, sha, model_uri, usage, spent, spending.prices)
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


__all__ = ["NAME", "train_model"]
