"""How each backend's ranks are started on this node. Imports no framework.

Every launcher starts the same rank entrypoint, ``python -m trainpipe.training.worker CONFIG``:

- torch_ddp, torch_fsdp: across nodes, torchrun (c10d rendezvous, ``--max-restarts``: a dead
  worker restarts the whole group, which resumes from the newest checkpoint); on one node the
  ranks themselves, with torchrun's environment, restarted as a group by trainpipe.
- horovod: ``horovodrun --gloo`` on this host, restarted as a group by trainpipe.
- tensorflow: one process per local worker with a generated ``TF_CONFIG``
  (MultiWorkerMirroredStrategy); trainpipe restarts the group itself (TF has no elastic launcher).

A launcher is a function from the settings to the commands and environments of this node's
processes, plus who restarts them; another scheduler (Slurm's ``srun``) is one more entry in
:data:`LAUNCHERS`. While the ranks run, a rank that reports a permanent error (bad data, a
wrong training function, an exception in the team's code) stops the group at once: restarting
cannot fix it. Every process started here dies with the launcher (``PR_SET_PDEATHSIG``, set by the
process itself once it runs: no Python runs between fork and exec, which is not safe while the
launcher has threads).

A SIGTERM or SIGUSR1 to the launcher is a preemption (a pod deleted, Kueue preempting, a spot node
reclaimed, Slurm's warning): it is passed to every rank of this node, under any wrapper (each rank
registers its pid in a folder the launcher reads), and to torchrun, which then does not restart
the group. Every rank finishes its step, the ranks write a checkpoint together and exit 75; the
launcher waits for them (up to ``collective_timeout_s``) and returns 75, so the orchestrator's
retry resumes exactly where they stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.contract import lifeline, warm
from trainpipe.contract.errors import EXIT_TRANSIENT, RETRYABLE_EXIT_CODES, InputError
from trainpipe.contract.lifeline import PARENT_ENV
from trainpipe.training.backends import BACKENDS
from trainpipe.training.control import PREEMPT_SIGNALS

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig

WORKER = "trainpipe.training.worker"
#: The folder where each rank of this node registers its pid once it catches the preemption signals.
PIDS_ENV = "TRAINPIPE_RANK_PIDS"


def node_rank(config: TrainModelConfig) -> int:
    """This node's rank: the config, else NODE_RANK / PET_NODE_RANK (Kubeflow Trainer) / RANK (PyTorchJob) /
    SLURM_NODEID (a task of a Slurm job, one per node)."""
    if config.node_rank is not None:
        return config.node_rank
    if config.nnodes == 1:
        return 0
    for var in ("NODE_RANK", "PET_NODE_RANK", "RANK", "SLURM_NODEID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    raise InputError(
        "node_rank: not set and none of NODE_RANK, PET_NODE_RANK, RANK, SLURM_NODEID is in the environment"
    )


def rdzv_endpoint(config: TrainModelConfig) -> str:
    """host:port of the rendezvous: the config, else MASTER_ADDR:MASTER_PORT (or the PET_ variants)."""
    if config.rdzv_endpoint:
        return config.rdzv_endpoint
    for prefix in ("", "PET_"):
        addr, port = os.environ.get(f"{prefix}MASTER_ADDR"), os.environ.get(f"{prefix}MASTER_PORT")
        if addr and port:
            return f"{addr}:{port}"
    raise InputError("rdzv_endpoint: nnodes > 1 needs rdzv_endpoint or MASTER_ADDR and MASTER_PORT in the environment")


def torchrun_command(config: TrainModelConfig, config_path: Path) -> list[str]:
    """The torchrun command line for this node of a multi-node job (c10d rendezvous; the rendezvous,
    not ``--node-rank``, decides which node hosts global rank 0)."""
    job_id = os.environ.get("TRAINPIPE_JOB_ID") or os.environ.get("PET_RDZV_ID") or "trainpipe"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={config.nnodes}",
        f"--node-rank={node_rank(config)}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint(config)}",
        f"--rdzv-id={job_id}",
        f"--rdzv-conf=timeout={config.collective_timeout_s}",
    ]
    return cmd + [
        f"--nproc-per-node={config.nproc_per_node}",
        f"--max-restarts={config.max_restarts}",
        "--monitor-interval=0.1",
        "-m",
        WORKER,
        str(config_path),
    ]


def horovodrun_command(config: TrainModelConfig, config_path: Path) -> list[str]:
    """horovodrun on this host with gloo (no MPI needed)."""
    n = config.nproc_per_node
    return [
        sys.executable,
        "-m",
        "horovod.runner.launch",
        "-np",
        str(n),
        "-H",
        f"localhost:{n}",
        "--gloo",
        "--start-timeout",
        str(config.collective_timeout_s),
        "--network-interface",
        "lo",
        sys.executable,
        "-m",
        WORKER,
        str(config_path),
    ]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(workers: list[str], index: int) -> dict[str, Any]:
    """The ``TF_CONFIG`` of worker ``index`` in a cluster of ``workers`` (host:port each)."""
    if not 0 <= index < len(workers):
        raise InputError(f"node_rank: {index} is outside the {len(workers)} workers")
    return {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": index}}


def tf_worker_envs(config: TrainModelConfig) -> list[dict[str, str]]:
    """The environment of each TF worker process this node starts.

    One node: ``nproc_per_node`` workers on 127.0.0.1 (a single process runs MirroredStrategy
    over the local devices). Several nodes: one worker per node, with the ``TF_CONFIG`` a TFJob
    or Trainer runtime puts in the environment, checked against ``nnodes``.
    """
    if config.nnodes == 1:
        if config.nproc_per_node == 1:
            return [{}]
        workers = [f"127.0.0.1:{p}" for p in free_ports(config.nproc_per_node)]
        return [{"TF_CONFIG": json.dumps(tf_config(workers, i)), "RANK": str(i)} for i in range(len(workers))]
    if config.nproc_per_node != 1:
        raise InputError(
            "nproc_per_node: backend tensorflow runs one worker per node (it uses every local GPU); set 1 for nnodes > "
            "1"
        )
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise InputError(
            "TF_CONFIG: backend tensorflow with nnodes > 1 needs TF_CONFIG in the environment (a TFJob or Trainer "
            "runtime sets it)"
        )
    try:
        cluster = json.loads(raw)["cluster"]["worker"]
    except (ValueError, KeyError, TypeError):
        raise InputError("TF_CONFIG: not a JSON object with cluster.worker") from None
    if len(cluster) != config.nnodes:
        raise InputError(f"TF_CONFIG: lists {len(cluster)} workers but nnodes is {config.nnodes}")
    return [{"TF_CONFIG": raw}]


@dataclass
class Plan:
    """This node's processes: commands, their environments, how many times trainpipe restarts the
    group (0 when the launcher restarts it itself, as torchrun does), and what each start of the
    group adds to each process's environment (one dict per process: a fresh rendezvous file, fresh
    worker ports), so a restarted group never meets what the failed one left behind."""

    commands: list[list[str]]
    envs: list[dict[str, str]]
    restarts: int
    label: str
    per_attempt: Callable[[], list[dict[str, str]]] | None = None
    preempt_wait_s: float = 300.0


#: Under the output folder: the files a node's ranks rendezvous through (removed when the step ends).
RENDEZVOUS_DIR = ".rendezvous"


def torch_plan(config: TrainModelConfig, config_path: Path, env: dict[str, str]) -> Plan:
    """torch_ddp and torch_fsdp: torchrun across nodes (c10d rendezvous, elastic restarts); on one
    node trainpipe starts the ranks itself with the environment torchrun gives them (RANK,
    LOCAL_RANK, WORLD_SIZE) and restarts the group after a failure as torchrun would.

    torchrun's agent is one more interpreter importing torch beside the ranks, which a small node
    pays for before the first step. Its store is not in a rank either: a rank that hosts a TCPStore
    server ran every training step measurably slower here (paired runs, 2 ranks on 2 cores), so the
    ranks rendezvous through a file (``FileStore``), a fresh one each start of the group."""
    if config.nnodes > 1:
        return Plan(
            [torchrun_command(config, config_path)], [env], 0, "torchrun", preempt_wait_s=config.collective_timeout_s
        )
    n = config.nproc_per_node
    common = {**env, "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0"}
    envs = [{**common, "RANK": str(i), "LOCAL_RANK": str(i)} for i in range(n)]
    rendezvous = Path(config.output_dir) / RENDEZVOUS_DIR

    def fresh_store() -> list[dict[str, str]]:
        import uuid

        rendezvous.mkdir(parents=True, exist_ok=True)
        return [{"TRAINPIPE_STORE_FILE": str(rendezvous / uuid.uuid4().hex)}] * n

    return Plan(
        [[sys.executable, "-m", WORKER, str(config_path)]] * n,
        envs,
        config.max_restarts,
        "torch",
        fresh_store if n > 1 else None,
        config.collective_timeout_s,
    )


def horovod_plan(config: TrainModelConfig, config_path: Path, env: dict[str, str]) -> Plan:
    return Plan(
        [horovodrun_command(config, config_path)],
        [env],
        config.max_restarts,
        "horovod",
        preempt_wait_s=config.collective_timeout_s,
    )


def tensorflow_plan(config: TrainModelConfig, config_path: Path, env: dict[str, str]) -> Plan:
    """One process per worker. On one node each start of the group gets fresh ports: a worker
    restarted onto the failed group's ports could meet a gRPC channel of the old cluster."""
    envs = tf_worker_envs(config)
    command = [sys.executable, "-m", WORKER, str(config_path)]
    if config.nnodes == 1 and len(envs) > 1:
        return Plan(
            [command] * len(envs),
            [env] * len(envs),
            config.max_restarts,
            "tensorflow",
            lambda: tf_worker_envs(config),
            config.collective_timeout_s,
        )
    return Plan(
        [command] * len(envs),
        [{**env, **extra} for extra in envs],
        config.max_restarts,
        "tensorflow",
        preempt_wait_s=config.collective_timeout_s,
    )


#: How a backend's ranks start on this node (its ``launcher`` in the backend table).
LAUNCHERS: dict[str, Callable[[Any, Path, dict[str, str]], Plan]] = {
    "torch": torch_plan,
    "horovod": horovod_plan,
    "tensorflow": tensorflow_plan,
}


#: What a guarded program gets when the launcher dies (:func:`~trainpipe.contract.lifeline.guarded`): torchrun
#: and horovodrun, launchers that are not trainpipe's worker, which sets the same thing itself. Each process the
#: launcher starts gets :data:`PARENT_ENV`: it checks it is still this parent's child once it asked to die with it.
GUARD_SIGNAL = signal.SIGKILL


def _dies_with_launcher(cmd: list[str]) -> list[str]:
    """The command as started: the worker guards itself; any other program guarded (:data:`GUARD_SIGNAL`).

    Not ``preexec_fn``: that runs Python in the child between fork and exec, which can deadlock
    while the launcher has other threads (the relays of the group it just stopped), and Popen
    then waits for that child forever. CI saw a restarted group hang that way with no output."""
    if cmd[1:3] == ["-m", WORKER]:
        return cmd
    return lifeline.guarded(cmd, GUARD_SIGNAL)


def _start(cmd: list[str], env: dict[str, str]) -> Any:
    """One process of the group, in its own session, its stderr piped to the relay: a rank of trainpipe's worker
    forked by the run's warm host where there is one (its torch imported once for every rank,
    :mod:`~trainpipe.contract.warm`), else started (:func:`_dies_with_launcher`)."""
    if cmd[1:3] == ["-m", WORKER]:
        forked = warm.spawn(cmd, env, stderr=True, start_new_session=True, deathsig=GUARD_SIGNAL)
        if forked is not None:
            return forked
    return subprocess.Popen(_dies_with_launcher(cmd), env=env, start_new_session=True, stderr=subprocess.PIPE)


def permanent_error(errors_dir: Path) -> dict[str, Any] | None:
    """The first error a rank reported that a restart cannot fix, if any."""
    if not errors_dir.is_dir():
        return None
    for path in sorted(errors_dir.glob("rank*.json")):
        try:
            err = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # being written (atomically): seen on the next poll
        if int(err.get("exit_code", 1)) not in RETRYABLE_EXIT_CODES:
            return err
    return None


def _silence_stdio() -> None:
    """Point stdout and stderr at /dev/null: a write to the dead parent's pipe would fail (EPIPE) in the
    middle of stopping the ranks, and the relays would stop reading them; the checkpoint must still be written."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.dup2(devnull, fd)
    os.close(devnull)


def reported(errors_dir: Path, kind: str) -> bool:
    """Whether a rank reported an error of this kind (``Preempted``: the ranks agreed to stop)."""
    for path in errors_dir.glob("rank*.json") if errors_dir.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text(encoding="utf-8")).get("type") == kind:
                return True
    return False


def _stop(procs: list[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM each process's group, SIGKILL what is left after ``grace`` seconds (at once with
    ``grace=0``); returns only when every process has exited (the process itself is killed too,
    whatever its group)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM if grace else signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for kill in (lambda p=p: os.killpg(p.pid, signal.SIGKILL), p.kill):
                try:
                    kill()
                except ProcessLookupError:
                    pass
            p.wait()


class _Preemption:
    """A stop the platform asked for, passed on to every rank of this node.

    Ranks register their pid in ``pid_dir`` once they catch the preemption signals (a rank still
    starting up is signalled when it registers); torchrun, which would restart its workers when
    they exit, gets SIGTERM and shuts down instead. horovodrun is left alone: it would give its
    ranks five seconds before killing them."""

    def __init__(self, plan: Plan, pid_dir: Path) -> None:
        self.plan, self.pid_dir = plan, pid_dir
        self.signum: int | None = None
        #: The platform's own signal, when one came (a budget's stop is this launcher's, not the platform's).
        self.received: int | None = None
        self.deadline = 0.0
        self._signalled: set[int] = set()
        self._parent = os.getppid()

    def on_signal(self, signum: int, procs: list[subprocess.Popen[bytes]], platform: bool = True) -> None:
        """Stop the ranks on ``signum``: the platform's (said at once in the log), or this launcher's own for a
        spent budget (``platform=False``: the step's last line says it, once)."""
        if os.getppid() != self._parent or warm.asker_gone():  # the task that started this step died: nobody
            # reads its output now
            _silence_stdio()
        if platform and self.received is None:
            self.received = signum
        if self.signum is None:
            self.signum, self.deadline = signum, time.monotonic() + self.plan.preempt_wait_s
            if platform:
                print(
                    f"train_model: {signal.Signals(signum).name} received: every rank checkpoints at the end of its "
                    "step and stops",
                    file=sys.stderr,
                    flush=True,
                )
            if self.plan.label == "torchrun":
                for p in procs:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGTERM)
        self.forward()

    def agreed(self) -> None:
        """The ranks agreed to stop on a signal they received and this launcher did not (Slurm signals every
        process of the step; a fault): the same as one it received, without a restart."""
        if self.signum is None:
            self.signum, self.deadline = signal.SIGTERM, time.monotonic() + self.plan.preempt_wait_s

    def forward(self) -> None:
        """Signal every registered rank not signalled yet."""
        if self.signum is None:
            return
        for name in os.listdir(self.pid_dir):
            pid = int(name) if name.isdigit() else 0
            if pid and pid not in self._signalled:
                self._signalled.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, self.signum)

    def over(self, codes: list[int | None]) -> bool:
        return all(c is not None for c in codes) or time.monotonic() > self.deadline


class _Relay:
    """Copies the launched processes' stderr (the ranks' logs) to ours, line by line, until muted."""

    def __init__(self) -> None:
        import threading

        self._muted = threading.Event()
        self._threads: list[Any] = []

    def follow(self, proc: subprocess.Popen[bytes]) -> None:
        import threading

        def copy() -> None:
            assert proc.stderr is not None
            for line in iter(proc.stderr.readline, b""):
                if not self._muted.is_set():
                    sys.stderr.buffer.write(line)
                    sys.stderr.buffer.flush()

        t = threading.Thread(target=copy, name="trainpipe-relay", daemon=True)
        t.start()
        self._threads.append(t)

    def mute(self) -> None:
        self._muted.set()

    def drain(self) -> None:
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []


#: The folder of the ranks' pid files, beside the run's error records (``<output_dir>/.ranks-<host>-<pid>``).
RANK_PIDS_PREFIX = ".ranks-"


def _alive(pid: str) -> bool:
    """Whether a process of this host has that pid (one that cannot be asked counts as alive)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def run_plan(
    plan: Plan, errors_dir: Path, abort: Callable[[], bool] | None = None, budget: Callable[[], bool] | None = None
) -> int:
    """Run the group; restart it ``plan.restarts`` times after a failure; stop at a permanent error;
    on a preemption signal, pass it on and wait for the ranks' checkpoint (no restart). ``budget`` is
    polled once a second: when it says the budget is spent, the ranks stop as on a preemption.

    A preemption signal the ranks finished before acting on (it came after their last control point,
    and every rank ended well) is the caller's: it goes on to the handler that was there before.

    Returns:
        0 when a run of the group succeeds, 75 when it was preempted, else the failing exit code
        (a permanent error's own).
    """
    import shutil
    import threading

    procs: list[subprocess.Popen[bytes]] = []
    relay = _Relay()
    # the ranks' pid files live beside the run's error records, never in the system's temp folder: a launcher
    # killed outright (SIGKILL) leaves them in its own run's folder, where a later launcher on this host clears
    # them once their launcher is gone (the nodes of a multi-node run share the folder: each keeps its own)
    host = socket.gethostname()
    for stale in errors_dir.parent.glob(f"{RANK_PIDS_PREFIX}{host}-*"):
        if not _alive(stale.name.rsplit("-", 1)[-1]):
            shutil.rmtree(stale, ignore_errors=True)
    pid_dir = errors_dir.parent / f"{RANK_PIDS_PREFIX}{host}-{os.getpid()}"
    pid_dir.mkdir(parents=True, exist_ok=True)
    preemption = _Preemption(plan, pid_dir)
    main = threading.current_thread() is threading.main_thread()
    previous = (
        {
            name: signal.signal(getattr(signal, name), lambda signum, _f: preemption.on_signal(signum, procs))
            for name in PREEMPT_SIGNALS
        }
        if main
        else {}
    )
    try:
        code = _attempts(plan, procs, relay, errors_dir, abort, preemption, {PIDS_ENV: str(pid_dir)}, budget)
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)
        shutil.rmtree(pid_dir, ignore_errors=True)
    if code == 0 and preemption.received is not None:
        handler = previous.get(signal.Signals(preemption.received).name)
        if callable(handler):
            handler(preemption.received, None)
    return code


def _attempts(
    plan: Plan,
    procs: list[subprocess.Popen[bytes]],
    relay: _Relay,
    errors_dir: Path,
    abort: Callable[[], bool] | None,
    preemption: _Preemption,
    common: dict[str, str],
    budget: Callable[[], bool] | None = None,
) -> int:
    code = 0
    next_check = time.monotonic() + 1.0
    for attempt in range(plan.restarts + 1):
        if attempt:
            print(
                f"train_model: {plan.label} group failed (exit {code}); restart {attempt}/{plan.restarts} from the "
                "newest checkpoint",
                file=sys.stderr,
            )
        extras = plan.per_attempt() if plan.per_attempt is not None else [{}] * len(plan.commands)
        parent = {"TRAINPIPE_ATTEMPT": str(attempt), PARENT_ENV: str(os.getpid()), **common}
        procs[:] = [
            _start(cmd, {**os.environ, **env, **extra, **parent})
            for cmd, env, extra in zip(plan.commands, plan.envs, extras, strict=True)
        ]
        for p in procs:
            relay.follow(p)
        while True:
            codes = [p.poll() for p in procs]
            if preemption.signum is None and reported(errors_dir, "Preempted"):
                preemption.agreed()
            if budget is not None and preemption.signum is None and time.monotonic() >= next_check:
                next_check = time.monotonic() + 1.0
                if budget():
                    preemption.on_signal(signal.SIGTERM, procs, platform=False)
            if preemption.signum is not None:
                preemption.forward()
                if preemption.over(codes):
                    _stop(procs, grace=0)
                    relay.drain()
                    return 0 if all(c == 0 for c in codes) else EXIT_TRANSIENT
                time.sleep(0.05)
                continue
            err = permanent_error(errors_dir)
            if err is not None:
                relay.mute()  # what the launchers print while being stopped is noise beside the one line
                _stop(procs, grace=0)  # the ranks catch SIGTERM (a preemption); these must stop now
                return int(err["exit_code"])
            if abort is not None and abort():
                relay.mute()
                _stop(procs, grace=0)  # the ranks catch SIGTERM (a preemption); these must stop now
                return 1
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                if permanent_error(errors_dir) is not None:
                    relay.mute()
                _stop(procs, grace=0)  # the ranks catch SIGTERM (a preemption); these must stop now
                relay.drain()
                code = failed[0]
                err = permanent_error(errors_dir)
                if err is not None:
                    return int(err["exit_code"])
                break
            if all(c == 0 for c in codes):
                relay.drain()
                return 0
            time.sleep(0.05)
    return code


def launch(
    config: TrainModelConfig,
    config_path: Path,
    env: dict[str, str],
    errors_dir: Path,
    abort: Callable[[], bool] | None = None,
    budget: Callable[[], bool] | None = None,
) -> int:
    """Start this node's ranks for the configured backend; the exit code of the group.

    ``abort`` is polled while they run: when it says so, the group is stopped. ``budget`` too: when it
    says the budget is spent, the ranks checkpoint at their step's end and stop (exit 75, as preempted).
    """
    plan = LAUNCHERS[BACKENDS[config.backend].launcher](config, config_path, env)
    return run_plan(plan, errors_dir, abort, budget)
