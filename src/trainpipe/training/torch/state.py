"""A torch training's checkpoint state: what the registered objects hold, staged into reused
buffers and written as ``torch.distributed.checkpoint`` files by the checkpoint manager's writer.

One format for every strategy: DDP's replicated state (each rank writes a share) and FSDP2's
sharded state alike, resharded on load when the world size changed; each rank's RNG states beside
it. Staging copies the state into buffers kept from one checkpoint to the next: on a GPU pinned
host memory, filled by non-blocking copies on a side stream that the training stream waits for
on the device (the host never waits); on a CPU plain memory, filled by one copy. The writer then
reads only the staged copy, so training changes nothing it writes.

Where every rank holds the whole model (DDP, Horovod, one process), each registered module's
weights are a plain safetensors file of their own, ``<name>.safetensors``, written by the chief
(:mod:`~trainpipe.training.weights_file`): the model the run ends with is then the last
checkpoint's file under a second name, not a second write of the same bytes
(:meth:`TorchState.unchanged_weights` says when it may be). Under FSDP2 the weights stay in the
DCP files, sharded. Imports torch.
"""

from __future__ import annotations

import base64
import copy
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json
from trainpipe.training.faults import Fault
from trainpipe.training.torch.strategies import TorchStrategy

SCALER_KEY = "_grad_scaler"
#: A module's weights in a checkpoint folder, beside the DCP files (strategies that hold them whole).
WEIGHTS_SUFFIX = ".safetensors"


def fingerprint(state: dict[str, torch.Tensor]) -> list[tuple[Any, ...]]:
    """What tells that a state's tensors are the very ones, unchanged, that it held before: each tensor's
    storage and its version counter (every in-place change bumps it: an optimizer step, ``load_state_dict``,
    ``copy_``), its dtype and shape. Reads no data."""
    return [
        (k, t.data_ptr(), t._version, t.dtype, tuple(t.shape), t.device)
        for k, t in sorted(state.items())
        if isinstance(t, torch.Tensor)
    ]


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random generator a step may draw from, as it is now."""
    import numpy as np

    np_state: Any = np.random.get_state()  # the legacy tuple (numpy's stubs also admit its dict form)
    py = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py[0], list(py[1]), py[2]],
    }


def rng_json(state: dict[str, Any]) -> dict[str, Any]:
    def b64(t: torch.Tensor | None) -> str | None:
        return None if t is None else base64.b64encode(t.numpy().tobytes()).decode("ascii")

    return {**state, "torch": b64(state["torch"]), "cuda": b64(state["cuda"])}


def set_rng(state: dict[str, Any], device: torch.device) -> None:
    import numpy as np

    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if state.get("cuda") and device.type == "cuda":
        torch.cuda.set_rng_state(
            torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8), device
        )
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


class Stager:
    """Copies a state dict into buffers it keeps: the copy is the only cost the loop pays.

    On a GPU the buffers are pinned and the copies run on a side stream after the training
    stream's queued work; the training stream then waits for them on the device, so nothing the
    loop does next can change what is being copied, and the host goes on at once. :meth:`wait`
    (the writer thread) waits until they have landed.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._buffers: dict[tuple[Any, ...], Any] = {}
        self._done: Any = None

    @property
    def nbytes(self) -> int:
        return sum(_local(b).numel() * _local(b).element_size() for b in self._buffers.values())

    def allocate(self, state: dict[str, Any]) -> None:
        """Make (and touch) every buffer ``state`` needs now, so the first checkpoint only copies."""
        self._walk(state, (), copy_into=False)

    def copy(self, state: dict[str, Any]) -> dict[str, Any]:
        """The staged copy of ``state``: same structure, tensors in the kept buffers."""
        if not self.cuda:
            return self._walk(state, (), copy_into=True)
        assert self.stream is not None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            staged = self._walk(state, (), copy_into=True)
        done = torch.cuda.Event()
        done.record(self.stream)
        torch.cuda.current_stream(self.device).wait_event(done)  # the loop's next kernels run after the copies
        self._done = done
        return staged

    def wait(self) -> None:
        """The copies have landed (a GPU's side stream); call before reading the staged copy."""
        if self._done is not None:
            self._done.synchronize()

    def _walk(self, obj: Any, path: tuple[Any, ...], copy_into: bool) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path, copy_into)
        if isinstance(obj, dict):
            return {k: self._walk(v, (*path, k), copy_into) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self._walk(v, (*path, i), copy_into) for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        return obj if isinstance(obj, (int, float, str, bool, type(None))) else copy.deepcopy(obj)

    def _tensor(self, t: torch.Tensor, path: tuple[Any, ...], copy_into: bool) -> Any:
        from torch.distributed.tensor import DTensor

        src = t.to_local() if isinstance(t, DTensor) else t
        src = src.detach()
        held = self._buffers.get(path)
        if held is None or _local(held).shape != src.shape or _local(held).dtype != src.dtype:
            held = self._buffers[path] = self._make(t, src)
        if copy_into:
            _local(held).copy_(src, non_blocking=self.cuda)
            if self.cuda and src.is_cuda:
                src.record_stream(self.stream)  # a temporary the state dict made stays alive until copied
        return held

    def _make(self, t: torch.Tensor, src: torch.Tensor) -> Any:
        from torch.distributed.tensor import DTensor

        pin = self.cuda and src.dim() > 0 and src.numel() > 0
        buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=pin)
        buf.zero_()  # touch the pages now, not during a checkpoint
        if not isinstance(t, DTensor):
            return buf
        staged = t.detach().to("cpu")  # a DTensor of the same placements holding a host shard (once)
        staged._local_tensor = buf
        return staged


def _local(t: Any) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def checkpoint_writer(path: Path, fault: Fault, step: int) -> Any:
    """DCP's file writer, its data files written around the page cache
    (:mod:`~trainpipe.training.direct_io`) and fsynced; with a ``kill_checkpoint`` fault, rank 0
    dies after the data files are written and before the metadata is (a checkpoint torn half way)."""
    from torch.distributed.checkpoint import FileSystemWriter

    from trainpipe.training.direct_io import direct_file_system

    class Writer(FileSystemWriter):
        def finish(self, metadata: Any, results: Any) -> None:
            fault.maybe_kill("kill_checkpoint", 0, step)
            super().finish(metadata, results)

    writer = Writer(str(path), sync_files=True)
    writer.fs = direct_file_system()
    return writer


class TorchState:
    """The :class:`~trainpipe.training.checkpoint.StateIO` of a torch training.

    Args:
        objects: What ``ctx.restore`` registered: modules, optimizers (of a registered module),
            schedulers and anything with ``state_dict``/``load_state_dict``.
        strategy: How the ranks' collectives run (the writer's, on its thread).
        device: This rank's device.
        scaler: fp16's GradScaler, checkpointed beside the objects.
        rank, chief: This rank.
        fault: Fault injection (``kill_checkpoint``).
        barrier: The loop's barrier (Horovod orders RNG files before the rename with it).

    Raises:
        InputError: an object has no state, or an optimizer belongs to no registered module.
    """

    def __init__(
        self,
        objects: dict[str, Any],
        strategy: TorchStrategy,
        device: torch.device,
        scaler: Any,
        rank: int,
        chief: bool,
        fault: Fault,
        barrier: Callable[[], None],
    ) -> None:
        modules = [v for v in objects.values() if isinstance(v, torch.nn.Module)]
        for name, obj in objects.items():
            if isinstance(obj, torch.optim.Optimizer):
                if not any(_owner(obj, m) for m in modules):
                    raise InputError(
                        f"train_function: ctx.restore({name}=...) is an optimizer of no module registered beside it"
                    )
            elif not isinstance(obj, torch.nn.Module) and not (
                hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")
            ):
                raise InputError(
                    f"train_function: ctx.restore({name}=...) has no state_dict/load_state_dict to checkpoint"
                )
        from torch.distributed.checkpoint import state_dict as _  # noqa: F401 (its import is start-up's cost, not a step's)

        self.objects, self.strategy, self.device, self.scaler = objects, strategy, device, scaler
        self.rank, self.chief, self.fault, self.barrier = rank, chief, fault, barrier
        self.stager = Stager(device)
        #: Modules whose weights are a safetensors file of their own (every rank holds them whole).
        self.own_files = (
            [k for k, v in objects.items() if isinstance(v, torch.nn.Module)] if strategy.whole_model else []
        )
        #: The last staged copy of those weights (host tensors) and the fingerprint of what it was copied from.
        self.staged_weights: dict[str, dict[str, torch.Tensor]] = {}
        self._staged_from: dict[str, list[tuple[Any, ...]]] = {}

    @property
    def staged_bytes(self) -> int:
        return self.stager.nbytes

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        modules = {k: v for k, v in self.objects.items() if isinstance(v, torch.nn.Module)}
        out: dict[str, Any] = {}
        for name, obj in self.objects.items():
            if isinstance(obj, torch.nn.Module):
                out[name] = get_model_state_dict(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                out[name] = get_optimizer_state_dict(next(m for m in modules.values() if _owner(obj, m)), obj)
            else:
                out[name] = obj.state_dict()
        if self.scaler is not None:
            out[SCALER_KEY] = self.scaler.state_dict()
        return out

    def prepare(self) -> None:
        self.stager.allocate(self._state())

    def stage(self, tmp: Path, step: int) -> Callable[[], None] | None:
        import torch.distributed.checkpoint as dcp

        from trainpipe.training import weights_file

        rng = rng_state(self.device)
        state = self._state()
        staged = self.stager.copy(state)
        weights = {name: staged.pop(name) for name in self.own_files}
        self.staged_weights = weights
        self._staged_from = {name: fingerprint(state[name]) for name in self.own_files}
        rng_file = tmp / f"rng-rank{self.rank}.json"
        if self.strategy.rng_files_before_rename:  # no collective of the write orders them: meet here
            atomic_write_json(rng_file, rng_json(rng))
            self.barrier()
        how = self.strategy.dcp_save(self.chief)
        if how is None:
            return None

        def write() -> None:
            self.stager.wait()
            if not rng_file.exists():
                atomic_write_json(rng_file, rng_json(rng))
            if self.chief:
                for name, tensors in weights.items():
                    weights_file.write(tmp / f"{name}{WEIGHTS_SUFFIX}", tensors)
            dcp.save(staged, storage_writer=checkpoint_writer(tmp, self.fault, step), **how)

        return write

    def unchanged_weights(self, state: dict[str, torch.Tensor]) -> str | None:
        """The registered module whose last staged weights ``state`` still is (the same tensors, none changed
        since: :func:`fingerprint`), so the checkpoint's weights file is ``state``'s too; else None."""
        now = fingerprint(state)
        return next((name for name, then in self._staged_from.items() if then == now), None)

    def load(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        from trainpipe.training.safe_dcp import SafeLoadPlanner, SafeReader

        reader, planner = SafeReader(str(path)), SafeLoadPlanner()  # a foreign checkpoint is refused, never run
        # refused here, in one line, before DCP (which would log a traceback and try per-rank files)
        reader.read_metadata()
        state = self._state()
        # a module's own weights file (a checkpoint of an earlier version keeps them in the DCP files)
        files = {name: path / f"{name}{WEIGHTS_SUFFIX}" for name in self.own_files}
        weights = {name: load_file(str(f)) for name, f in files.items() if f.is_file()}
        dcp.load(
            {k: v for k, v in state.items() if k not in weights},
            storage_reader=reader,
            planner=planner,
            **self.strategy.dcp_load(),
        )
        state.update(weights)
        modules = {k: v for k, v in self.objects.items() if isinstance(v, torch.nn.Module)}
        for name, obj in self.objects.items():
            if isinstance(obj, torch.nn.Module):
                set_model_state_dict(obj, state[name])
            elif isinstance(obj, torch.optim.Optimizer):
                set_optimizer_state_dict(next(m for m in modules.values() if _owner(obj, m)), obj, state[name])
            else:
                obj.load_state_dict(state[name])
        if self.scaler is not None and SCALER_KEY in state:
            self.scaler.load_state_dict(state[SCALER_KEY])
        rng = path / f"rng-rank{self.rank}.json"
        if rng.is_file():
            set_rng(json.loads(rng.read_text(encoding="utf-8")), self.device)
        else:  # the world grew: a new rank starts from a seeded state of its own
            torch.manual_seed(self.strategy.settings.seed + 7919 * self.rank)


def _owner(opt: torch.optim.Optimizer, module: torch.nn.Module) -> bool:
    ids = {id(p) for p in module.parameters()}
    return all(id(p) in ids for g in opt.param_groups for p in g["params"])
