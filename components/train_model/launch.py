"""How each backend's ranks are started on this node. Imports no framework.

- torch_ddp: torchrun (``--standalone`` on one node; c10d rendezvous across nodes),
  with ``--max-restarts``: a dead worker restarts the whole group, which resumes
  from the newest checkpoint.
- tensorflow: one process per local worker with a generated ``TF_CONFIG``
  (MultiWorkerMirroredStrategy); one process with MirroredStrategy when the job is a
  single worker. trainpipe restarts the group itself (TF has no elastic launcher).
- horovod: ``horovodrun --gloo`` on this host, restarted as a group the same way.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.contract.errors import InputError

PKG = "trainpipe.components.train_model"


def node_rank(config: TrainModelConfig) -> int:
    """This node's rank: the config, else NODE_RANK / PET_NODE_RANK (Kubeflow Trainer) / RANK (PyTorchJob)."""
    if config.node_rank is not None:
        return config.node_rank
    if config.nnodes == 1:
        return 0
    for var in ("NODE_RANK", "PET_NODE_RANK", "RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    raise InputError("node_rank: not set and none of NODE_RANK, PET_NODE_RANK, RANK is in the environment")


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
    """The torchrun command line for this node."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if config.nnodes == 1:
        cmd += ["--standalone", "--nnodes=1"]
    else:
        job_id = os.environ.get("TRAINPIPE_JOB_ID") or os.environ.get("PET_RDZV_ID") or "trainpipe"
        cmd += [
            f"--nnodes={config.nnodes}",
            f"--node-rank={node_rank(config)}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint(config)}",
            f"--rdzv-id={job_id}",
            f"--rdzv-conf=timeout={config.collective_timeout_s}",
        ]
    cmd += [
        f"--nproc-per-node={config.nproc_per_node}",
        f"--max-restarts={config.max_restarts}",
        "--monitor-interval=0.5",
        "-m",
        f"{PKG}.torch_ddp",
        str(config_path),
    ]
    return cmd


def horovodrun_command(config: TrainModelConfig, config_path: Path) -> list[str]:
    """horovodrun on this host with gloo (no MPI needed)."""
    n = config.nproc_per_node
    return [
        sys.executable, "-m", "horovod.runner.launch",
        "-np", str(n), "-H", f"localhost:{n}", "--gloo",
        "--start-timeout", str(config.collective_timeout_s),
        "--network-interface", "lo",
        sys.executable, "-m", f"{PKG}.horovod_torch", str(config_path),
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

    One node: ``nproc_per_node`` workers on 127.0.0.1 (a single process runs
    MirroredStrategy over the local devices). Several nodes: one worker per node, with
    the ``TF_CONFIG`` a TFJob or Trainer runtime puts in the environment, checked
    against ``nnodes``.
    """
    if config.nnodes == 1:
        if config.nproc_per_node == 1:
            return [{}]
        workers = [f"127.0.0.1:{p}" for p in free_ports(config.nproc_per_node)]
        return [{"TF_CONFIG": json.dumps(tf_config(workers, i)), "RANK": str(i)} for i in range(len(workers))]
    if config.nproc_per_node != 1:
        raise InputError("nproc_per_node: backend tensorflow runs one worker per node (it uses every local GPU); set 1 for nnodes > 1")
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise InputError("TF_CONFIG: backend tensorflow with nnodes > 1 needs TF_CONFIG in the environment (a TFJob or Trainer runtime sets it)")
    try:
        cluster = json.loads(raw)["cluster"]["worker"]
    except (ValueError, KeyError, TypeError):
        raise InputError("TF_CONFIG: not a JSON object with cluster.worker") from None
    if len(cluster) != config.nnodes:
        raise InputError(f"TF_CONFIG: lists {len(cluster)} workers but nnodes is {config.nnodes}")
    return [{"TF_CONFIG": raw}]


def run_group(commands: list[list[str]], envs: list[dict[str, str]], max_restarts: int, label: str) -> int:
    """Run a group of processes; if one fails, stop the rest and restart the group.

    Returns:
        0 when a run of the group succeeds, else the first failing exit code of the last attempt.
    """
    code = 0
    for attempt in range(max_restarts + 1):
        if attempt:
            print(f"train_model: {label} group failed (exit {code}); restart {attempt}/{max_restarts} from the newest checkpoint", file=sys.stderr)
        procs = [
            subprocess.Popen(cmd, env={**os.environ, **env, "TRAINPIPE_ATTEMPT": str(attempt)}, start_new_session=True)
            for cmd, env in zip(commands, envs)
        ]
        code = _wait_group(procs)
        if code == 0:
            return 0
    return code


def _wait_group(procs: list[subprocess.Popen[bytes]]) -> int:
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def launch(config: TrainModelConfig, config_path: Path, env: dict[str, str]) -> int:
    """Start this node's ranks for the configured backend; the exit code of the group."""
    if config.backend == "torch_ddp":
        return subprocess.run(torchrun_command(config, config_path), env=env, check=False).returncode
    if config.backend == "horovod":
        cmd = horovodrun_command(config, config_path)
        return run_group([cmd], [env], config.max_restarts, "horovod")
    envs = [{**env, **extra} for extra in tf_worker_envs(config)]
    cmd = [sys.executable, "-m", f"{PKG}.tf_worker", str(config_path)]
    return run_group([cmd] * len(envs), envs, config.max_restarts, "tensorflow")
