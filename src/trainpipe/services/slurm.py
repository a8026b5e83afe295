"""Slurm from the submitting side: the sbatch script, ``sbatch``, ``scontrol show job``, ``scancel``.

Stdlib only, and no component: train_model's Slurm launcher (and any later step that runs on
Slurm) builds on it. The job is watched with ``scontrol show job``, which answers from the
controller without accounting storage (``sacct``/``slurmdbd``), so it works on the smallest
cluster; a finished job stays visible there for the cluster's ``MinJobAge``.

Nothing secret enters the script: the job inherits the submitting environment
(``--export=ALL``), where credentials already are, and the platform policy travels the same way.
"""

from __future__ import annotations

import math
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainpipe.contract.errors import InputError, ServiceUnavailable

#: States in which a job may still run (a requeued job passes through them again).
ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "SUSPENDED",
        "STOPPED",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
    }
)
#: Ends that another attempt can get past: the cluster, not the job, was at fault.
TRANSIENT_ENDS = frozenset({"TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"})


@dataclass(frozen=True)
class Job:
    """One ``scontrol show job`` record, the fields trainpipe reads."""

    job_id: str
    state: str
    exit_code: int = 0
    exit_signal: int = 0
    restarts: int = 0
    reason: str = ""
    std_out: str = ""
    fields: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @classmethod
    def parse(cls, line: str) -> Job:
        """A record of ``scontrol show job -o`` (one line of ``Key=Value`` pairs)."""
        fields: dict[str, str] = {}
        for token in re.findall(r"(\w+)=(\S*)", line):
            fields.setdefault(token[0], token[1])
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        return cls(
            job_id=fields.get("JobId", ""),
            state=fields.get("JobState", "UNKNOWN"),
            exit_code=int(code) if code.isdigit() else 0,
            exit_signal=int(sig) if sig.isdigit() else 0,
            restarts=int(fields.get("Restarts", "0") or 0),
            reason=fields.get("Reason", ""),
            std_out=fields.get("StdOut", ""),
            fields=fields,
        )


def _run(
    cmd: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    tool = cmd[0]
    if shutil.which(tool, path=(env or {}).get("PATH")) is None:
        raise InputError(f"slurm: {tool} is not on PATH (submit from a login node of the cluster, with Slurm's tools)")
    try:
        return subprocess.run(
            list(cmd), env=dict(env) if env is not None else None, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise ServiceUnavailable(f"slurm: {tool} did not answer within {timeout:.0f} s") from None


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[0] if lines else "no message"


def submit(script: str, env: Mapping[str, str] | None = None) -> str:
    """``sbatch --parsable`` the script file; the job id.

    Raises:
        InputError: the controller refused the job (a wrong partition, account, QoS, time or resource).
        ServiceUnavailable: the controller cannot be reached.
    """
    done = _run(["sbatch", "--parsable", script], env)
    if done.returncode == 0:
        return done.stdout.strip().split(";")[0]
    msg = _first_error(done.stderr)
    if re.search(r"unable to contact|connection refused|timed out|not responding|socket", msg, re.I):
        raise ServiceUnavailable(f"slurm: the controller cannot be reached: {msg}")
    raise InputError(f"slurm: sbatch refused the job: {msg}")


def show(job_id: str, env: Mapping[str, str] | None = None) -> Job | None:
    """The job as the controller knows it; None once it has forgotten it (``MinJobAge`` after its end).

    Raises:
        ServiceUnavailable: the controller cannot be reached.
    """
    done = _run(["scontrol", "show", "job", "-o", job_id], env)
    if done.returncode != 0:
        if "invalid job id" in done.stderr.lower():
            return None
        raise ServiceUnavailable(f"slurm: scontrol show job {job_id}: {_first_error(done.stderr)}")
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("JobId=")), "")
    return Job.parse(line) if line else None


def cancel(job_id: str, env: Mapping[str, str] | None = None, signal_name: str | None = None) -> None:
    """``scancel`` the job (or send it a signal); a job already gone is fine."""
    cmd = ["scancel", *([f"--signal={signal_name}"] if signal_name else []), job_id]
    done = _run(cmd, env)
    quiet = ("invalid job id", "already completing", "already completed")
    if done.returncode != 0 and not any(q in done.stderr.lower() for q in quiet):
        raise ServiceUnavailable(f"slurm: scancel {job_id}: {_first_error(done.stderr)}")


def wait(
    job_id: str,
    poll_s: float,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    on_change: Callable[[Job], None] | None = None,
) -> Job:
    """Poll until the job ends (a requeued job keeps being waited for); cancel it on SIGTERM or a timeout.

    Returns:
        The ended job (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...).

    Raises:
        ServiceUnavailable: the wait timed out (the job is cancelled), or the controller is gone.
        SystemExit: this process was told to stop (SIGTERM): the job is cancelled first.
    """

    def stop(signum: int, _frame: Any) -> None:
        cancel(job_id, env)
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if main else None
    try:
        deadline = time.monotonic() + timeout_s
        seen: tuple[str, int] | None = None
        while True:
            job = show(job_id, env)
            if job is None:
                raise ServiceUnavailable(f"slurm: job {job_id} is not known to the controller (ended long ago?)")
            if on_change is not None and (job.state, job.restarts) != seen:
                on_change(job)
            seen = (job.state, job.restarts)
            if not job.active:
                return job
            if time.monotonic() > deadline:
                cancel(job_id, env)
                raise ServiceUnavailable(f"slurm: job {job_id} did not finish within {timeout_s:.0f} s; cancelled it")
            time.sleep(poll_s)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def time_limit(seconds: float) -> str:
    """Seconds as Slurm's ``--time`` (``D-HH:MM:SS``), rounded up to the minute."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


_UNITS = {"": 1 / 2**20, "k": 1e3 / 2**20, "m": 1e6 / 2**20, "g": 1e9 / 2**20, "t": 1e12 / 2**20}
_UNITS.update({"ki": 1 / 2**10, "mi": 1, "gi": 2**10, "ti": 2**20})


def memory_mb(quantity: str) -> int:
    """A Kubernetes memory quantity (``4G``, ``16Gi``, ``512Mi``) in Slurm's MB (MiB), rounded up."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]i?)?", quantity.strip())
    if not m:
        raise InputError(f"memory_limit: {quantity!r} is not a memory quantity (e.g. 4G, 16Gi)")
    return max(1, math.ceil(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]))


def cpus(quantity: str) -> int:
    """A Kubernetes CPU quantity (``2``, ``500m``) as whole CPUs, at least one."""
    q = quantity.strip()
    value = float(q[:-1]) / 1000 if q.endswith("m") else float(q)
    return max(1, math.ceil(value))


@dataclass(frozen=True)
class BatchJob:
    """What one sbatch script asks for, and what its nodes run."""

    job_name: str
    nodes: int
    ntasks_per_node: int
    cpus_per_task: int
    mem_mb: int
    time: str
    output: str
    body: list[str]
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    requeue: bool = True
    signal_s: int = 0
    extra: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)

    def directives(self) -> list[str]:
        """The ``#SBATCH`` options, in a fixed order."""
        opts = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            f"--ntasks-per-node={self.ntasks_per_node}",
            f"--cpus-per-task={self.cpus_per_task}",
            f"--mem={self.mem_mb}M",
        ]
        opts += [f"--gres=gpu:{self.gpus_per_node}"] if self.gpus_per_node else []
        opts += [
            f"--{k}={v}" for k, v in (("partition", self.partition), ("account", self.account), ("qos", self.qos)) if v
        ]
        opts += [f"--time={self.time}", "--requeue" if self.requeue else "--no-requeue"]
        opts += [f"--signal=USR1@{self.signal_s}"] if self.signal_s else []
        # every attempt of a requeued job appends to one log; the job inherits the submitter's environment
        opts += [f"--output={self.output}", "--open-mode=append", "--export=ALL", *self.extra]
        return opts

    def script(self) -> str:
        lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in self.directives())]
        lines += [
            "# Written by trainpipe. No secret is in this file: the job inherits the submitting environment.",
            "set -u",
            *self.setup,
            *self.body,
        ]
        return "\n".join(lines) + "\n"
