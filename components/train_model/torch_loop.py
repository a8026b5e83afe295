"""The PyTorch training loop shared by the torch_ddp and horovod backends.

A backend supplies a :class:`Collectives` (rank, world, all-reduce, barrier, how to
wrap the model and optimizer); everything else is here: data sharding, mixed
precision, step checkpoints with exact resume, telemetry and the model artifact.

Checkpoints (``ckpt-<global step>.pt``) hold the model, optimizer, grad scaler,
RNG states, the position in the epoch (which fixes the sampler's position, since
the global order is a function of seed and epoch) and the epoch's metric sums, so
a resumed run continues exactly where the checkpoint was taken. Rank 0 alone
writes them, atomically; every rank loads the same one with ``weights_only=True``.
"""

from __future__ import annotations

import io
import json
import os
import platform
import resource
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from trainpipe.components.train_model.data import prepare_data, rank_batches, steps_per_epoch
from trainpipe.components.train_model.models import build_model
from trainpipe.components.train_model.rank import Fault, checkpoint_dir, model_meta, weights_digest
from trainpipe.components.train_model.spec import (
    METRICS_FILE,
    MODEL_FILE,
    MODEL_META,
    TELEMETRY_DIR,
    TrainModelConfig,
)
from trainpipe.contract.errors import TrainpipeError
from trainpipe.contract.io import atomic_write_bytes, atomic_write_chunks, atomic_write_json, atomic_write_text
from trainpipe.resources import usable_cpus

CKPT_GLOB = "ckpt-*.pt"


@dataclass
class Collectives:
    """What a distributed backend provides to the loop."""

    name: str
    rank: int
    world: int
    local_rank: int
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]
    barrier: Callable[[], None]
    wrap: Callable[[torch.nn.Module, torch.optim.Optimizer], tuple[torch.nn.Module, torch.optim.Optimizer]]
    optimizer_step: Callable[[torch.optim.Optimizer, Any], None] = field(default=lambda opt, scaler: _plain_step(opt, scaler))


def _plain_step(opt: torch.optim.Optimizer, scaler: Any) -> None:
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()


def serialize_checkpoint(state: dict[str, Any]) -> memoryview:
    """The checkpoint's bytes: a consistent copy, taken before the next optimizer step (a view of
    the serialized buffer, not a second copy of it: the training loop waits for this part)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getbuffer()


def write_checkpoint(ckpt_dir: Path, step: int, data: bytes | memoryview, keep: int, fault: Fault) -> Path:
    """Write ``ckpt-<step>.pt`` atomically (tmp + fsync + rename) and keep the newest ``keep``."""

    def chunks() -> Iterator[bytes]:
        half = len(data) // 2
        yield data[:half]
        fault.maybe_kill("kill_checkpoint", 0, step)
        yield data[half:]

    path = atomic_write_chunks(ckpt_dir / f"ckpt-{step:010d}.pt", chunks())
    for old in sorted(ckpt_dir.glob(CKPT_GLOB))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def remove_partial_checkpoints(ckpt_dir: Path) -> None:
    """Drop the hidden temp files of writes a killed run left behind (before any new write starts)."""
    if ckpt_dir.is_dir():
        for stale in ckpt_dir.glob(".ckpt-*.tmp"):
            stale.unlink(missing_ok=True)


def save_checkpoint(ckpt_dir: Path, step: int, state: dict[str, Any], keep: int, fault: Fault) -> Path:
    """Serialize and write a checkpoint in the caller's thread."""
    return write_checkpoint(ckpt_dir, step, serialize_checkpoint(state), keep, fault)


class CheckpointWriter:
    """Checkpoints written on a background thread, so training does not wait for the disk.

    The loop serializes the state (a consistent copy) and goes on; the writer thread writes,
    fsyncs and renames it. One write is in flight at a time: the next save, and ``wait`` at the
    end of training, wait for it and re-raise its error. A process killed mid-write leaves the
    previous checkpoint, as with a synchronous write.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, ckpt_dir: Path, step: int, state: dict[str, Any], keep: int, fault: Fault) -> None:
        data = serialize_checkpoint(state)
        self.wait()
        self._thread = threading.Thread(target=self._write, args=(ckpt_dir, step, data, keep, fault), name="trainpipe-checkpoint", daemon=True)
        self._thread.start()

    def _write(self, *args: Any) -> None:
        try:
            write_checkpoint(*args)
        except BaseException as exc:  # re-raised in the training thread by wait()
            self._error = exc

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def load_latest_checkpoint(ckpt_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The newest checkpoint that loads with ``weights_only=True``; unreadable ones are skipped with a warning."""
    if not ckpt_dir.is_dir():
        return None, None
    for path in sorted(ckpt_dir.glob(CKPT_GLOB), reverse=True):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or "global_step" not in state:
                raise ValueError("not a trainpipe checkpoint")
            return state, path.name
        except Exception as exc:  # a torn or foreign file: fall back to the previous one
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            print(f"train_model: warning: skipping unreadable checkpoint {path.name}: {first[:200]}", file=sys.stderr)
    return None, None


def resolve_device(config: TrainModelConfig, local_rank: int) -> torch.device:
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def autocast_dtype(config: TrainModelConfig) -> torch.dtype | None:
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[config.precision]


def train(config: TrainModelConfig, coll: Collectives, device: torch.device) -> None:
    """Train on this rank until ``epochs`` (or ``max_steps``) are done, resuming from the newest checkpoint."""
    out = Path(config.output_dir)
    ckpt_dir = checkpoint_dir(config)
    fault = Fault.from_env()
    rank, world = coll.rank, coll.world
    data = prepare_data(config)
    torch.manual_seed(config.seed)
    model = build_model(config.model, data["input_shape"], len(data["classes"]), config.hidden_units, config.model_kwargs).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=config.learning_rate, momentum=config.momentum)
    amp_dtype = autocast_dtype(config)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None

    if rank == 0:
        remove_partial_checkpoints(ckpt_dir)
    ckpt, ckpt_name = load_latest_checkpoint(ckpt_dir)
    global_step = 0
    carried = torch.zeros(3, dtype=torch.float64)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
        global_step = int(ckpt["global_step"])
        carried = ckpt["epoch_sums"].to(torch.float64)
        if rank == 0:
            print(f"train_model: resuming from {ckpt_name} (step {global_step})", file=sys.stderr)
    # Every rank must resume from the same step: a rank that read another file would diverge.
    agree = coll.all_reduce_sum(torch.tensor([float(global_step), float(global_step) ** 2], dtype=torch.float64))
    if float(agree[0]) ** 2 != world * float(agree[1]):
        raise TrainpipeError("checkpoint: ranks loaded different checkpoints; is checkpoint_dir shared by every node?")
    resumed_from = global_step
    train_model, opt = coll.wrap(model, opt)

    x = torch.from_numpy(data["x"])
    y = torch.from_numpy(data["y"])
    n = int(x.shape[0])
    per_epoch = steps_per_epoch(n, config.batch_size)
    total = per_epoch * config.epochs if config.max_steps is None else min(config.max_steps, per_epoch * config.epochs)
    loss_fn = torch.nn.CrossEntropyLoss()
    metrics_path = out / METRICS_FILE
    start_epoch, start_in_epoch = divmod(global_step, per_epoch)
    history = [
        line
        for line in (metrics_path.read_text(encoding="utf-8").splitlines() if metrics_path.exists() else [])
        if line.strip() and json.loads(line)["epoch"] < start_epoch
    ]
    steps: list[dict[str, float]] = []
    prof = TorchProfile(config, out, device) if config.profile_steps and rank == 0 else None
    gpu = NvmlSampler(device) if device.type == "cuda" else None
    writer = CheckpointWriter()
    sums = StepSums()
    on_cpu = device.type == "cpu"
    t_start = time.perf_counter()
    first_step_s: float | None = None
    first_step_unix: float | None = None  # wall clock, so a launcher can measure launch-to-first-step

    def checkpoint_state(in_epoch_sums: torch.Tensor) -> dict[str, Any]:
        return {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else {},
            "rng": {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None},
            "global_step": global_step,
            "epoch_sums": in_epoch_sums,
        }

    for epoch in range(start_epoch, config.epochs):
        if global_step >= total:
            break
        skip = start_in_epoch if epoch == start_epoch else 0
        batches = torch.from_numpy(rank_batches(n, config.batch_size, config.seed, epoch, rank, world, skip))
        if epoch != start_epoch:
            carried = torch.zeros(3, dtype=torch.float64)
        train_model.train()
        t_prev = time.perf_counter()
        for idx in batches:
            if global_step >= total:
                break
            fault.maybe_kill("kill", rank, global_step)
            if on_cpu:  # .to() would return the same tensors, at a few µs a call
                xb, yb = x[idx], y[idx]
            else:
                xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
            t_data = time.perf_counter()
            opt.zero_grad()
            if amp_dtype is None:  # a disabled autocast context still costs tens of µs a step
                logits = train_model(xb)
                loss = loss_fn(logits, yb)
            else:
                with torch.autocast(device.type, dtype=amp_dtype):
                    logits = train_model(xb)
                loss = loss_fn(logits.float(), yb)
            t_fwd = time.perf_counter()
            (scaler.scale(loss) if scaler is not None else loss).backward()
            t_bwd = time.perf_counter()
            coll.optimizer_step(opt, scaler)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t_end = time.perf_counter()
            global_step += 1
            b = int(yb.shape[0])
            sums.add(loss, logits, yb, b)
            if first_step_s is None:
                first_step_s, first_step_unix = t_end - t_start, time.time()
            steps.append(
                {
                    "epoch": epoch,
                    "step": global_step,
                    "samples": b,
                    "data_s": t_data - t_prev,
                    "forward_s": t_fwd - t_data,
                    "backward_s": t_bwd - t_fwd,
                    "optimizer_s": t_end - t_bwd,
                    "other_s": 0.0,
                    "step_s": t_end - t_prev,
                    "t": t_end - t_start,
                }
            )
            epoch_done = global_step % per_epoch == 0
            if config.checkpoint_every_steps and global_step % config.checkpoint_every_steps == 0 and not epoch_done and global_step < total:
                carried = carried + coll.all_reduce_sum(sums.take())
                if rank == 0:
                    writer.save(ckpt_dir, global_step, checkpoint_state(carried), config.keep_checkpoints, fault)
            t_done = time.perf_counter()
            _settle(steps[-1], t_done - t_end)  # bookkeeping and checkpoints count toward the step
            if prof is not None:
                prof.step()  # the profiler's own cost (trace export) stays out of the step times
            t_prev = time.perf_counter()
        t_epoch_end = time.perf_counter()
        epoch_sums = carried + coll.all_reduce_sum(sums.take())
        carried = torch.zeros(3, dtype=torch.float64)
        loss_e, acc_e = float(epoch_sums[0] / max(epoch_sums[2], 1)), float(epoch_sums[1] / max(epoch_sums[2], 1))
        if rank == 0:
            history.append(json.dumps({"epoch": epoch, "step": global_step, "loss": loss_e, "accuracy": acc_e}))
            atomic_write_text(metrics_path, "".join(line + "\n" for line in history))
            writer.save(ckpt_dir, global_step, checkpoint_state(torch.zeros(3, dtype=torch.float64)), config.keep_checkpoints, fault)
            print(f"train_model: epoch {epoch + 1}/{config.epochs} step {global_step} loss {loss_e:.4f} accuracy {acc_e:.4f}", file=sys.stderr)
        if steps:
            _settle(steps[-1], time.perf_counter() - t_epoch_end)
        start_in_epoch = 0

    writer.wait()  # the last checkpoint is on disk before the model is reported
    wall = time.perf_counter() - t_start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    atomic_write_json(
        out / TELEMETRY_DIR / f"rank{rank}.json",
        {
            "rank": rank,
            "world_size": world,
            "backend": config.backend,
            "device": str(device),
            "dist_backend": coll.name,
            "precision": config.precision,
            "threads": torch.get_num_threads(),
            "weights_sha256": weights_digest({k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}),
            "batch_size": config.batch_size,
            "wall_s": wall,
            "time_to_first_step_s": first_step_s,
            "first_step_unix": first_step_unix,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "usable_cpus": usable_cpus(),
            "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("HOROVOD_LOCAL_SIZE", world))),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
            "peak_rss_mb": usage.ru_maxrss / 1024.0,
            "peak_device_mb": (torch.cuda.max_memory_allocated(device) / 2**20) if device.type == "cuda" else None,
            "profiler": prof.finish() if prof is not None else None,
            "gpu": gpu.finish() if gpu is not None else None,
            "steps": steps,
        },
    )
    coll.barrier()
    if rank == 0:
        write_model(out, model, data, config, device, coll.name, world, resumed_from, global_step, wall)


class StepSums:
    """This rank's loss, correct-prediction and sample sums over the steps since the last ``take``.

    A step only keeps its loss and predicted classes (tensors on the device: no host sync, no
    reduction); ``take`` folds them into ``[loss × samples, correct, samples]`` (float64) at an
    epoch end or a checkpoint, and every ``FOLD_EVERY`` steps so the lists stay small.
    """

    FOLD_EVERY = 512

    def __init__(self) -> None:
        self.acc = torch.zeros(3, dtype=torch.float64)
        self.losses: list[torch.Tensor] = []
        self.preds: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []
        self.sizes: list[int] = []

    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, samples: int) -> None:
        self.losses.append(loss.detach())
        self.preds.append(logits.detach().argmax(1))
        self.labels.append(labels)
        self.sizes.append(samples)
        if len(self.sizes) >= self.FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        if not self.sizes:
            return
        sizes = torch.tensor(self.sizes, dtype=torch.float64)
        losses = torch.stack(self.losses).double().cpu()
        correct = (torch.cat(self.preds) == torch.cat(self.labels)).sum().double().cpu()
        self.acc += torch.stack([(losses * sizes).sum(), correct, sizes.sum()])
        self.losses, self.preds, self.labels, self.sizes = [], [], [], []

    def take(self) -> torch.Tensor:
        """The sums since the last take (a new tensor), and start again from zero."""
        self._fold()
        out, self.acc = self.acc, torch.zeros(3, dtype=torch.float64)
        return out


def _settle(record: dict[str, float], extra: float) -> None:
    record["other_s"] += extra
    record["step_s"] += extra


PROFILE_SKIP = 3  # steps before the profiler's warm-up step: the first steps are not steady


class TorchProfile:
    """torch.profiler over a window of steps on rank 0: a Chrome trace, FLOPs and collective time."""

    def __init__(self, config: TrainModelConfig, out: Path, device: torch.device) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        self.active = config.profile_steps
        self.first = PROFILE_SKIP + 1  # index (in this run's steps) of the first traced step
        self.trace = out / TELEMETRY_DIR / "trace_rank0.json"
        self.info: dict[str, Any] | None = None
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=PROFILE_SKIP, warmup=1, active=self.active, repeat=1),
            on_trace_ready=self._ready,
            with_flops=True,
        )
        self.prof.start()

    def _ready(self, prof: Any) -> None:
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.trace))
        events = prof.key_averages()
        collective = [e for e in events if any(k in e.key.lower() for k in ("all_reduce", "allreduce", "gloo", "nccl", "broadcast"))]
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
        self.info = {
            "trace": self.trace.name,
            "first_step_index": self.first,
            "steps": self.active,
            "flops_per_step": sum(int(e.flops or 0) for e in events) / self.active,
            "collective_ms_per_step": sum(e.cpu_time_total for e in collective) / 1000.0 / self.active,
            "top_ops": [{"name": e.key, "self_cpu_ms": e.self_cpu_time_total / 1000.0, "calls": int(e.count)} for e in top],
        }

    def step(self) -> None:
        self.prof.step()

    def finish(self) -> dict[str, Any] | None:
        self.prof.stop()
        return self.info


class NvmlSampler:
    """GPU utilization and memory of this rank's device through NVML, sampled every 0.5 s in a thread."""

    def __init__(self, device: torch.device) -> None:
        self.util: list[float] = []
        self.mem: list[float] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:  # no NVML (driver, or nvidia-ml-py not installed): nothing to sample
            self._nvml = None
            return
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            self.util.append(float(rates.gpu))
            self.mem.append(info.used / 2**20)

    def finish(self) -> dict[str, Any] | None:
        if self._nvml is None:
            return None
        self._stop.set()
        self._thread.join(timeout=2)
        if not self.util:
            return None
        return {"utilization_pct_mean": sum(self.util) / len(self.util), "memory_used_mb_max": max(self.mem), "samples": len(self.util)}


def write_model(
    out: Path, model: torch.nn.Module, data: dict[str, Any], config: TrainModelConfig, device: torch.device,
    dist_backend: str, world: int, resumed_from: int, global_step: int, wall: float,
) -> None:
    """The model artifact: weights in safetensors (loading runs no code) and model.json."""
    from safetensors.torch import save

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(out / MODEL_FILE, save(state))
    atomic_write_json(out / MODEL_META, model_meta(data, config, device.type, dist_backend, world, resumed_from, global_step, wall))
