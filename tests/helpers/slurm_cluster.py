"""A real one-node Slurm cluster for tests and benchmarks: munged, slurmctld and slurmd from Debian's
packages, started by hand on free loopback ports with their config, state and logs in one folder,
never as system services, and stopped by PID.

The node is this machine under the name ``localhost`` (``slurmd -N localhost``: the hostname is not
localhost). ``cred_expire`` is lowered and the scheduler runs every second, so a requeued job
starts again within seconds instead of minutes. Clients find the cluster through ``SLURM_CONF``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel")


def missing() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(int(line.split()[1]) / 1024 * 0.9)
    return 4096


def _stepds() -> set[int]:
    out = subprocess.run(["pgrep", "-x", "slurmstepd"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _pid(path: Path, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip())
        time.sleep(0.1)
    raise RuntimeError(f"no pid file at {path}")


def _stop_pid(pid: int, timeout: float = 15) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def slurm_cluster(root: Path) -> Iterator[dict[str, str]]:
    """Start the cluster under ``root``; yields the environment its clients need (``SLURM_CONF``)."""
    root = Path(root)
    munge, state, spool, logs = (root / n for n in ("munge", "state", "spool", "log"))
    for d in (munge, state, spool, logs):
        d.mkdir(parents=True, exist_ok=True)
    munge.chmod(0o711)  # munged refuses a socket folder others may write to
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    sock = munge / "munge.sock"
    conf = root / "slurm.conf"
    cpus = os.cpu_count() or 2
    conf.write_text(
        f"""ClusterName=trainpipe
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock},cred_expire=5
CredType=cred/munge
StateSaveLocation={state}
SlurmdSpoolDir={spool}/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={logs}/slurmctld.log
SlurmdLogFile={logs}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=3600
KillWait=30
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=localhost NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_memory_mb()}
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""",
        encoding="utf-8",
    )
    env = {"SLURM_CONF": str(conf)}
    full = {**os.environ, **env}
    before = _stepds()
    pids: list[int] = []
    try:
        subprocess.run(
            [
                _binary("munged"),
                "--force",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--log-file={logs / 'munged.log'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'seed'}",
            ],
            check=True,
            env=full,
        )
        pids.append(_pid(munge / "munged.pid"))
        subprocess.run([_binary("slurmctld"), "-f", str(conf), "-i"], check=True, env=full)
        pids.append(_pid(root / "slurmctld.pid"))
        subprocess.run([_binary("slurmd"), "-f", str(conf), "-N", "localhost"], check=True, env=full)
        pids.append(_pid(root / "slurmd.pid"))
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=full).stdout.strip()
            if out in ("idle", "mix", "alloc"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm node did not come up (sinfo: {out!r}); logs in {logs}")
            time.sleep(0.3)
        yield env
    finally:
        # drain the queue first: a running slurmstepd outlives the daemons
        subprocess.run(["scancel", "--full", "--partition=debug"], capture_output=True, env=full)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            q = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=full)
            if q.returncode != 0 or not q.stdout.strip():
                break
            time.sleep(0.3)
        for pid in reversed(pids):
            _stop_pid(pid)
        for pid in _stepds() - before:
            _stop_pid(pid, timeout=5)
