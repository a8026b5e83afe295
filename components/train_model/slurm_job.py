"""train_model on Slurm: the step submits the training as a batch job, waits, and takes node 0's model.

With a ``slurm`` section the step does not train itself. It writes the node config and an sbatch
script into the job's folder on the shared filesystem, submits it (or reattaches to the job an
earlier attempt of this step submitted), polls ``scontrol show job`` until the job ends, and copies
node 0's model back as its own output, like the Kubernetes jobs in :mod:`.k8s`.

Inside the allocation ``srun`` starts one task per node, the component's own entrypoint: on one
node it starts the ranks itself, on several it runs torchrun with the c10d rendezvous on the first
node of ``SLURM_JOB_NODELIST`` (horovod runs horovodrun inside its one node). The node rank comes
from ``SLURM_NODEID``.

Preemption: Slurm's warning (``--signal=USR1@N`` before the time limit, ``scancel --signal=USR1``)
and its SIGTERM reach every rank through the launcher: the ranks finish their step, write a
checkpoint and exit 75; the batch script then requeues the job (``scontrol requeue``; a preemption
with ``PreemptMode=REQUEUE`` requeues it itself). The requeued job keeps its id, ``Restarts``
rises, and it resumes from the checkpoint in the job's folder. Every attempt passes the same run id
(the orchestrator's, else ``slurm-<job id>``), so MLflow records one training run, not one per attempt.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainpipe.components.train_model.node_result import adopt
from trainpipe.components.train_model.spec import NAME, SlurmJob, TrainModelConfig, TrainModelResult
from trainpipe.contract.errors import Cancelled, InputError, Preempted, TrainpipeError
from trainpipe.contract.io import atomic_write_json, atomic_write_settings, atomic_write_text
from trainpipe.contract.lineage import Lineage
from trainpipe.contract.policy import ENV as POLICY_ENV
from trainpipe.contract.policy import to_env
from trainpipe.contract.result import ErrorRecord
from trainpipe.contract.runtime import PROFILE_ENV, Runtime
from trainpipe.data.tabular import find_dataset
from trainpipe.services import slurm
from trainpipe.services.profiles import get_profile
from trainpipe.services.profiles import to_env as profile_env

#: Set by the Airflow face after its deferral: collect this job (ended by now), never submit another.
ATTACH_ENV = "TRAINPIPE_SLURM_JOB_ID"
JOB_FILE, SCRIPT_FILE, CONFIG_FILE = "job.json", "train.sbatch", "train.json"
_SBATCH_ARG = re.compile(r"^--[a-z][a-z-]*(=\S+)?$")


def workdir_of(config: TrainModelConfig) -> Path:
    assert config.slurm is not None
    return Path(config.slurm.workdir or Path(config.output_dir) / "slurm").resolve()


def job_name(run_id: str, output_dir: str) -> str:
    """The same for every attempt of one step of one run (its run id and output)."""
    return "trainpipe-train-" + hashlib.sha256(f"{run_id}|{Path(output_dir).resolve()}".encode()).hexdigest()[:12]


def node_config(config: TrainModelConfig, workdir: Path) -> TrainModelConfig:
    """What every node reads: the same settings, its own output folder, checkpoints in the job's folder."""
    return config.model_copy(
        update={
            "data": str(find_dataset(config.data, "data").resolve()),
            "output_dir": str(workdir / "node0"),  # each node's --output-dir overrides it
            "checkpoint_dir": str(Path(config.checkpoint_dir).resolve())
            if config.checkpoint_dir
            else str(workdir / "checkpoints"),
            "slurm": None,
            "node_rank": None,
            "rdzv_endpoint": None,
        }
    )


def stage(config: TrainModelConfig, workdir: Path) -> Path:
    """Write the settings every node reads (``train.json``: the team's ``train_config`` in its own order and types)."""
    return atomic_write_settings(workdir / CONFIG_FILE, node_config(config, workdir))


def batch_job(config: TrainModelConfig, workdir: Path, name: str, orchestrator: str, run_id: str) -> slurm.BatchJob:
    """The sbatch script of this training: resources from the hardware profile, the rest from ``slurm``."""
    job = config.slurm
    assert job is not None
    for arg in job.sbatch_args:
        if not _SBATCH_ARG.fullmatch(arg):
            raise InputError(f"slurm.sbatch_args: {arg!r} is not one sbatch option (--name or --name=value)")
    profile = get_profile(job.profile)
    res = profile.train
    python = job.python or sys.executable
    # one task per node: the entrypoint, which starts the node's ranks (or torchrun's agent)
    node = (
        'exec "$0" -m trainpipe.components.train_model --config "$1/train.json"'
        ' --output-dir "$1/node$SLURM_NODEID" --result "$1/node$SLURM_NODEID.result.json"'
        ' --error-record "$1/node$SLURM_NODEID.error.json"'
        f" --orchestrator {shlex.quote(orchestrator)} --run-id {shlex.quote(run_id)}"
        if run_id
        else 'exec "$0" -m trainpipe.components.train_model --config "$1/train.json"'
        ' --output-dir "$1/node$SLURM_NODEID" --result "$1/node$SLURM_NODEID.result.json"'
        ' --error-record "$1/node$SLURM_NODEID.error.json"'
        ' --orchestrator slurm --run-id "slurm-$SLURM_JOB_ID"'
    )
    body = [
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"export MASTER_ADDR MASTER_PORT={job.rdzv_port} TRAINPIPE_JOB_ID={name}-$SLURM_JOB_ID",
        # the profile itself (a file here need not be on the nodes): the lineage records it, the cost is at its prices
        f"export {PROFILE_ENV}={shlex.quote(profile_env(profile))}",
        'echo "trainpipe: job $SLURM_JOB_ID, attempt $((${SLURM_RESTART_COUNT:-0} + 1)), nodes $SLURM_JOB_NODELIST"',
        f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c {shlex.quote(node)} {shlex.quote(python)} "
        f"{shlex.quote(str(workdir))}",
        "code=$?",
        "# 75: the ranks checkpointed on a preemption warning: requeue, and the next attempt resumes from it",
    ]
    body += ['if [ "$code" -eq 75 ] && scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi'] if job.requeue else []
    body += ['exit "$code"']
    return slurm.BatchJob(
        job_name=name,
        nodes=config.nnodes,
        ntasks_per_node=1,
        cpus_per_task=slurm.cpus(res.cpu_request),
        mem_mb=slurm.memory_mb(res.memory_limit),
        gpus_per_node=res.accelerator_count if res.accelerated else 0,
        partition=job.partition,
        account=job.account,
        qos=job.qos,
        time=job.time_limit or slurm.time_limit(profile.train_timeout_s),
        requeue=job.requeue,
        signal_s=job.signal_s,
        output=str(workdir / "slurm-%j.out"),
        extra=list(job.sbatch_args),
        setup=list(job.setup),
        body=body,
    )


def _job_env(runtime: Runtime, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The submitting environment plus the platform policy: what the job inherits (--export=ALL)."""
    env = dict(os.environ if base is None else base)
    env.pop(ATTACH_ENV, None)
    rules = to_env(runtime.policy) if runtime.policy is not None else "{}"
    if rules != "{}":
        env[POLICY_ENV] = rules
    return env


def _reattachable(workdir: Path, digest: str, env: dict[str, str]) -> str | None:
    """The job an earlier attempt of this step submitted with the same script, while it runs or once it succeeded."""
    try:
        record = json.loads((workdir / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if record.get("script_sha256") != digest:
        return None
    job = slurm.show(str(record.get("job_id", "")), env)
    if job is not None and (job.active or job.state == "COMPLETED"):
        return job.job_id
    return None


def submit(
    config: TrainModelConfig, lineage: Lineage, runtime: Runtime, base_env: Mapping[str, str] | None = None
) -> str:
    """Write the node config and the script, and submit; or reattach to this step's earlier job. The job id."""
    assert config.slurm is not None
    workdir = workdir_of(config)
    workdir.mkdir(parents=True, exist_ok=True)
    orch = lineage.orchestrator
    run_id = orch.run_id if orch and orch.run_id else ""
    name = config.slurm.job_name or job_name(run_id, config.output_dir)
    script = batch_job(config, workdir, name, orch.name if orch and run_id else "slurm", run_id).script()
    stage(config, workdir)
    digest = hashlib.sha256((script + (workdir / CONFIG_FILE).read_text(encoding="utf-8")).encode()).hexdigest()
    env = _job_env(runtime, base_env)
    earlier = _reattachable(workdir, digest, env)
    if earlier is not None:
        print(
            f"{NAME}: reattaching to Slurm job {earlier}, which an earlier attempt of this step submitted", flush=True
        )
        return earlier
    for stale in workdir.glob("node*"):  # a finished job's model is not this job's
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    atomic_write_text(workdir / SCRIPT_FILE, script)
    job_id = slurm.submit(str(workdir / SCRIPT_FILE), env)
    atomic_write_json(workdir / JOB_FILE, {"job_id": job_id, "job_name": name, "script_sha256": digest})
    print(f"{NAME}: submitted Slurm job {job_id} ({name}); log {workdir / f'slurm-{job_id}.out'}", flush=True)
    return job_id


def failure(job: slurm.Job, log: Path) -> TrainpipeError:
    """The error of a job that did not complete: a node's one line, from the error record its entrypoint wrote."""
    records = [ErrorRecord.read(p) for p in sorted(log.parent.glob("node*.error.json"))]
    line = next((r.message for r in records if r is not None), "")
    if job.state == "FAILED" and job.exit_code == 2:
        return InputError(line or f"slurm: job {job.job_id} failed on bad input (log {log})")
    if job.state == "FAILED" and job.exit_code == 75 or job.state in slurm.TRANSIENT_ENDS:
        return Preempted(
            f"slurm: job {job.job_id} ended {job.state} (exit {job.exit_code}); a retry resumes from its checkpoint"
        )
    if job.state == "OUT_OF_MEMORY":
        return InputError(
            f"slurm: job {job.job_id} ran out of memory (the profile's memory_limit is its --mem): give the profile "
            f"more memory or train with a smaller batch (log {log})"
        )
    if job.state == "CANCELLED":
        return Cancelled(f"slurm: job {job.job_id} was cancelled outside trainpipe (scancel); not retried (log {log})")
    what = f"{job.state}, exit {job.exit_code}" + (f", signal {job.exit_signal}" if job.exit_signal else "")
    return TrainpipeError(f"slurm: job {job.job_id} ended {what}: {line or f'see {log}'}")


def run_slurm_job(config: TrainModelConfig, lineage: Lineage, runtime: Runtime) -> TrainModelResult:
    """Submit (or reattach), wait, and bring node 0's model back into ``output_dir``."""
    job_cfg: SlurmJob | None = config.slurm
    assert job_cfg is not None
    workdir = workdir_of(config)
    env = _job_env(runtime)
    job_id = os.environ.get(ATTACH_ENV) or submit(config, lineage, runtime)

    def report(job: slurm.Job) -> None:
        print(f"{NAME}: Slurm job {job.job_id} {job.state} (restarts {job.restarts})", flush=True)

    job = slurm.wait(job_id, job_cfg.poll_s, job_cfg.timeout_s, env, on_change=report)
    if job.state != "COMPLETED":
        raise failure(job, workdir / f"slurm-{job_id}.out")
    return collect(config, lineage, workdir, job)


def collect(config: TrainModelConfig, lineage: Lineage, workdir: Path, job: slurm.Job) -> TrainModelResult:
    return adopt(workdir / "node0.result.json", workdir / "node0", config.output_dir, lineage, f"slurm/{job.job_id}")


def submit_settings(settings: dict[str, Any], run_id: str, env: Mapping[str, str]) -> tuple[str, SlurmJob]:
    """The Airflow face's first half (the wait is deferred to the triggerer): the task's rendered
    settings read as the entrypoint reads them, submitted under ``env``'s policy. The job id, and the
    Slurm settings (how often to poll, how long to wait).

    Raises:
        InputError: bad settings, or a job Slurm refused.
        ServiceUnavailable: the controller cannot be reached.
    """
    from trainpipe.contract.entrypoint import parse_settings
    from trainpipe.contract.lineage import run_sections
    from trainpipe.contract.policy import load_policy

    config = parse_settings(TrainModelConfig, settings, where=NAME)
    if config.slurm is None:
        raise InputError("slurm: not set; the task trains on the worker")
    runtime = Runtime(policy=load_policy(env.get(POLICY_ENV, "")))
    lineage = Lineage().with_(**run_sections("airflow", run_id))
    return submit(config, lineage, runtime, env), config.slurm
