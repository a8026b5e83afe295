"""The training context for PyTorch: DDP (gloo or NCCL), FSDP2 and Horovod.

Checkpoints are ``torch.distributed.checkpoint`` folders (one format for every strategy:
replicated DDP state and FSDP2's sharded state alike, resharded on load when the world size
changed), written asynchronously on a process group of their own, plus each rank's RNG states
and the trainer's position. A folder is written under a hidden temporary name and renamed once
every rank's part is on disk.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import platform
import random
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_bytes, atomic_write_json
from trainpipe.training.loop import TELEMETRY_DIR, BaseContext

STRATEGIES = {"torch_ddp": "ddp", "torch_fsdp": "fsdp", "horovod": "horovod"}
#: The file a node's ranks rendezvous through when trainpipe starts them (a fresh one each start).
STORE_FILE_ENV = "TRAINPIPE_STORE_FILE"


def resolve_device(settings: Any, local_rank: int) -> torch.device:
    use_cuda = settings.device == "cuda" or (settings.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _attempt_store(rank: int, timeout: timedelta) -> Any:
    """The rendezvous store, under a prefix of its own for each restart of the group: a restarted
    rank must not dial the address a dead peer published in the previous attempt."""
    import torch.distributed as dist

    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=not agent_hosts and rank == 0,
                         timeout=timeout, wait_for_workers=False)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    return dist.PrefixStore(f"trainpipe/{run_id}/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)


class TorchContext(BaseContext):
    """``ctx`` of a PyTorch training function.

    A function prepares its model, makes its optimizer, registers both with :meth:`restore`,
    iterates :meth:`batches`, and per batch runs the forward pass under :meth:`autocast`, then
    :meth:`backward` and :meth:`step`; :meth:`log` records what to report; :meth:`save_model`
    writes the model at the end. Everything else (sharding, checkpoints, exact resume, restarts,
    collective timeouts, telemetry, fault injection) is the context's.

    Attributes:
        device: This rank's ``torch.device``.
        strategy: ``ddp``, ``fsdp`` or ``horovod``.
        precision: ``fp32``, ``bf16`` or ``fp16``.
    """

    framework = "torch"

    def __init__(self, settings: Any) -> None:
        self.strategy = STRATEGIES[settings.backend]
        self.precision = settings.precision
        self._hvd: Any = None
        self._averaging: dict[torch.nn.Parameter, Any] = {}  # Horovod: a parameter's gradient average in flight
        self._ckpt_group: Any = None
        if self.strategy == "horovod":
            import horovod.torch as hvd

            hvd.init()
            self._hvd = hvd
            rank, world, local = hvd.rank(), hvd.size(), hvd.local_rank()
            os.environ["RANK"] = str(rank)
        else:
            rank, world, local = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
        self.device = resolve_device(settings, local)
        if self.strategy != "horovod":
            import torch.distributed as dist

            backend = settings.dist_backend if settings.dist_backend != "auto" else ("nccl" if self.device.type == "cuda" else "gloo")
            timeout = timedelta(seconds=settings.collective_timeout_s)
            if os.environ.get(STORE_FILE_ENV):  # one node, ranks started by trainpipe: a file for a store
                store = dist.FileStore(os.environ[STORE_FILE_ENV], world)
                store.set_timeout(timeout)
                dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
            elif "MASTER_ADDR" in os.environ:  # torchrun across nodes
                dist.init_process_group(backend, store=_attempt_store(rank, timeout), rank=rank, world_size=world, timeout=timeout)
            else:  # launched by hand as one process
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
            # checkpoints are written on a thread: their collectives get a gloo group of their own
            self._ckpt_group = dist.new_group(backend="gloo", timeout=timeout)
            dist_name = backend
        else:
            dist_name = "horovod-nccl" if self.device.type == "cuda" else "horovod-gloo"
        super().__init__(settings, rank, world, local, dist_name)
        self._amp = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[settings.precision]
        self.scaler = torch.amp.GradScaler("cuda") if self._amp == torch.float16 else None
        self._models: list[torch.nn.Module] = []
        self._optimizer: torch.optim.Optimizer | None = None
        self._writer: _CheckpointWriter = _CheckpointWriter()
        self._profiler = _TorchProfile(settings, self.out, self.device) if settings.profile_steps and self.is_chief else None
        self._gpu = _NvmlSampler(self.device) if self.device.type == "cuda" else None
        self._on_cpu = self.device.type == "cpu"

    # --- model ----------------------------------------------------------------------------------

    def prepare(self, model: torch.nn.Module, *, forward_sync_buffers: bool | None = None) -> torch.nn.Module:
        """Put ``model`` on this rank's device and wrap it for the strategy.

        DDP wraps it in ``DistributedDataParallel`` (not with one rank), FSDP2 shards every child
        that holds parameters and then the root (``fully_shard``), Horovod broadcasts rank 0's
        parameters and buffers. Make the optimizer from the returned model's parameters.

        ``forward_sync_buffers`` (DDP, torch's name): whether rank 0's buffers are sent to every
        rank before each forward pass. Every rank starts with rank 0's buffers either way. Left
        ``None``, it is on only when the model has normalization layers that track running
        statistics (the buffers that change while training); constant buffers, such as a
        standardization's mean and std, then cost nothing per step. Pass ``True`` if your model
        updates other buffers itself.
        """
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"train_function: ctx.prepare takes a torch.nn.Module, not {type(model).__name__}")
        model = model.to(self.device)
        if self.strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for child in model.children():
                if any(True for _ in child.parameters()):
                    fully_shard(child)
            fully_shard(model)
        elif self.strategy == "horovod":
            self._hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            self._average_during_backward(model)
        elif self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            if forward_sync_buffers is None:
                forward_sync_buffers = _tracks_running_stats(model)
            model = DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None, forward_sync_buffers=forward_sync_buffers
            )
        self._models.append(model)
        return model

    def _average_during_backward(self, model: torch.nn.Module) -> None:
        """Horovod: start each gradient's average as soon as backward has it (as Horovod's
        DistributedOptimizer does), so communication overlaps the rest of the backward pass;
        :meth:`step` waits for them. A second backward before the step (accumulation) starts the
        average of the accumulated gradient instead."""
        index = len(self._models)

        def started(name: str, param: torch.nn.Parameter) -> None:
            earlier = self._averaging.pop(param, None)
            if earlier is not None:
                self._hvd.synchronize(earlier)  # every rank does the same: nothing is left in flight
            self._averaging[param] = self._hvd.allreduce_async(param.grad, op=self._hvd.Average, name=name)

        for name, param in model.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(functools.partial(started, f"trainpipe.grad.{index}.{name}"))

    @staticmethod
    def unwrap(model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside a DDP wrapper (FSDP2 and Horovod do not wrap)."""
        return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model

    @staticmethod
    def model_class(module: torch.nn.Module) -> type:
        """The team's own class of a module: FSDP2's ``fully_shard`` swaps it for a class it makes on
        the fly (``FSDP<Name>``, which no one can import to rebuild the model)."""
        from torch.distributed.fsdp import FSDPModule

        return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))

    def autocast(self) -> Any:
        """The forward pass's precision: autocast to bf16/fp16, or nothing for fp32."""
        if self._amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._amp)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled for fp16, timed apart from the forward pass."""
        self._mark("backward_start")
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        self._mark("backward_end")

    def _averaged(self, optimizer: torch.optim.Optimizer) -> None:
        """Horovod: put each gradient's average (started during backward) in place; average at once
        any the hooks did not see (parameters of a model not given to :meth:`prepare`)."""
        rest = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                pending = self._averaging.pop(p, None)
                if pending is not None:
                    p.grad.copy_(self._hvd.synchronize(pending))
                elif p.grad is not None:
                    rest.append(p.grad)
        if rest:
            self._hvd.grouped_allreduce_(rest, op=self._hvd.Average)

    def step(self, optimizer: torch.optim.Optimizer, clip_grad_norm: float | None = None, zero_grad: bool = True) -> None:
        """One optimizer step: gradients averaged over ranks (Horovod), unscaled and clipped when
        asked, ``optimizer.step()``, then ``zero_grad``. Counts the step (checkpoints follow it)."""
        self._mark("step_start")
        self._optimizer = optimizer
        if self._hvd is not None:
            self._averaged(optimizer)
        if clip_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._mark("step_end")
        self._count_step()

    def peer_failure(self, exc: BaseException) -> bool:
        import torch.distributed as dist

        if isinstance(exc, getattr(dist, "DistError", ())) or type(exc).__name__ == "HorovodInternalError":
            return True
        text = str(exc)
        return isinstance(exc, RuntimeError) and any(k in text for k in ("gloo", "NCCL", "Connection reset", "Connection closed", "timed out", "Timed out"))

    # --- reductions -----------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """``tensor`` summed (``op="sum"``) or averaged (``"mean"``) over every rank; a new tensor."""
        if op not in ("sum", "mean"):
            raise InputError(f"train_function: ctx.all_reduce op must be 'sum' or 'mean', not {op!r}")
        t = tensor.detach().clone()
        if self.world_size > 1:
            if self._hvd is not None:
                t = self._hvd.allreduce(t, op=self._hvd.Sum, name=f"ctx.all_reduce.{t.numel()}")
            else:
                import torch.distributed as dist

                dist.all_reduce(t)
        return t / self.world_size if op == "mean" else t

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        if self.world_size == 1:
            return t.tolist()
        if self._hvd is not None:
            return self._hvd.allreduce(t, op=self._hvd.Sum, name=f"trainpipe.sums.{len(values)}").tolist()
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            moved = t.to(self.device)
            dist.all_reduce(moved)
            return moved.cpu().tolist()
        dist.all_reduce(t)
        return t.tolist()

    def _keep(self, value: Any) -> Any:
        return value.detach() if isinstance(value, torch.Tensor) else float(value)

    def _fold(self, values: list[Any]) -> float:
        tensors = [v.reshape(()).double() for v in values if isinstance(v, torch.Tensor)]
        rest = sum(v for v in values if not isinstance(v, torch.Tensor))
        return float(torch.stack(tensors).sum().item() if tensors else 0.0) + float(rest)

    # --- data -----------------------------------------------------------------------------------

    def _array(self, values: Any) -> Any:
        return torch.as_tensor(values)

    def _indices(self, rows: Any) -> Any:
        return torch.from_numpy(rows)

    def _take(self, array: Any, rows: Any) -> Any:
        return self._to_device(array[rows])

    def _from_host(self, batch: Any) -> Any:
        return self._to_device(batch if isinstance(batch, torch.Tensor) else torch.from_numpy(batch))

    def _plan_other(self, source: Any) -> tuple[int, Callable[[int, int], Iterator[Any]]]:
        from trainpipe.training.data import rank_batches, steps_per_epoch

        if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
            raise InputError(f"train_function: ctx.batches cannot iterate a {type(source).__name__} "
                             "(give TabularData, a ParquetStream, a tuple or dict of arrays, a map-style dataset or a StreamSource)")
        from torch.utils.data import default_collate

        s, n = self.settings, len(source)

        def mapped(epoch: int, skip: int) -> Iterator[Any]:
            for idx in rank_batches(n, s.batch_size, s.seed, epoch, self.rank, self.world_size, skip):
                items = source.__getitems__(idx.tolist()) if hasattr(source, "__getitems__") else [source[int(i)] for i in idx]
                yield _move(default_collate(items), self._to_device)

        return steps_per_epoch(n, s.batch_size), mapped

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if self._on_cpu else t.to(self.device, non_blocking=True)

    def _on_batch_end(self) -> None:
        if self._profiler is not None:
            self._profiler.step()

    # --- checkpoints ----------------------------------------------------------------------------

    def _validate_state(self, objects: dict[str, Any]) -> None:
        modules = [v for v in objects.values() if isinstance(v, torch.nn.Module)]
        for name, obj in objects.items():
            if isinstance(obj, torch.optim.Optimizer):
                if not any(self._owner(obj, m) for m in modules):
                    raise InputError(f"train_function: ctx.restore({name}=...) is an optimizer of no module registered beside it")
            elif not isinstance(obj, torch.nn.Module) and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise InputError(f"train_function: ctx.restore({name}=...) has no state_dict/load_state_dict to checkpoint")

    def _ready_checkpoints(self) -> None:
        import torch.distributed.checkpoint  # noqa: F401
        import torch.distributed.checkpoint.state_dict  # noqa: F401

        _faulty_writer_class()

    @staticmethod
    def _owner(opt: torch.optim.Optimizer, module: torch.nn.Module) -> bool:
        ids = {id(p) for p in module.parameters()}
        return all(id(p) in ids for g in opt.param_groups for p in g["params"])

    def _app_state(self, for_load: bool) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        assert self._state is not None
        modules = {k: v for k, v in self._state.items() if isinstance(v, torch.nn.Module)}
        out: dict[str, Any] = {}
        for name, obj in self._state.items():
            if isinstance(obj, torch.nn.Module):
                out[name] = get_model_state_dict(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                owner = next(m for m in modules.values() if self._owner(obj, m))
                out[name] = get_optimizer_state_dict(owner, obj)
            else:
                out[name] = obj.state_dict()
        if self.scaler is not None:
            out["_grad_scaler"] = self.scaler.state_dict()
        return out

    def _rng_state(self) -> dict[str, Any]:
        import numpy as np

        np_state = np.random.get_state()
        return {
            "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
            "cuda": base64.b64encode(torch.cuda.get_rng_state(self.device).numpy().tobytes()).decode("ascii") if self.device.type == "cuda" else None,
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        }

    def _set_rng(self, state: dict[str, Any]) -> None:
        import numpy as np

        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
        if state.get("cuda") and self.device.type == "cuda":
            torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8), self.device)
        n = state["numpy"]
        np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
        p = state["python"]
        random.setstate((p[0], tuple(p[1]), p[2]))

    def _save_state(self, tmp: Path, final: Path, trainer: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        self._writer.wait()  # one checkpoint in flight
        tmp.mkdir(parents=True, exist_ok=True)
        atomic_write_json(tmp / f"rng-rank{self.rank}.json", self._rng_state())
        state = self._app_state(for_load=False)
        writer = _FaultyWriter(str(tmp), self.fault, self.global_step)
        if self._hvd is not None:  # no torch process group: the replicas' state is rank 0's
            self._barrier()  # every rank's RNG file is written before rank 0 renames the folder
            if not self.is_chief:
                return
            future = dcp.async_save(state, storage_writer=writer, no_dist=True)
        else:
            future = dcp.async_save(state, storage_writer=writer, process_group=self._ckpt_group)
        finalize = (lambda: self._finalize_checkpoint(tmp, final, trainer)) if self.is_chief else None
        self._writer.start(future, finalize)

    def _load_state(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        assert self._state is not None
        from trainpipe.training.safe_dcp import SafeLoadPlanner, SafeReader

        reader, planner = SafeReader(str(path)), SafeLoadPlanner()  # a foreign checkpoint is refused, never run
        reader.read_metadata()  # refused here, in one line, before DCP (which would log a traceback and try per-rank files)
        state = self._app_state(for_load=True)
        if self._hvd is not None:
            dcp.load(state, storage_reader=reader, planner=planner, no_dist=True)
        else:
            dcp.load(state, storage_reader=reader, planner=planner, process_group=self._ckpt_group)
        modules = {k: v for k, v in self._state.items() if isinstance(v, torch.nn.Module)}
        for name, obj in self._state.items():
            if isinstance(obj, torch.nn.Module):
                set_model_state_dict(obj, state[name])
            elif isinstance(obj, torch.optim.Optimizer):
                owner = next(m for m in modules.values() if self._owner(obj, m))
                set_optimizer_state_dict(owner, obj, state[name])
            else:
                obj.load_state_dict(state[name])
        if self.scaler is not None and "_grad_scaler" in state:
            self.scaler.load_state_dict(state["_grad_scaler"])
        rng = path / f"rng-rank{self.rank}.json"
        if rng.is_file():
            self._set_rng(json.loads(rng.read_text(encoding="utf-8")))
        else:  # the world grew: a new rank starts from a seeded state of its own
            torch.manual_seed(self.settings.seed + 7919 * self.rank + self.global_step)

    def _wait_writes(self) -> None:
        self._writer.wait()

    # --- the model ------------------------------------------------------------------------------

    def _save_model(self, model: torch.nn.Module, input_example: Any, init_args: dict[str, Any] | None, builder: Any, classes: list[Any] | None, task: str) -> None:
        from trainpipe.serving import loader

        module = self.unwrap(model)
        if self.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            state = module.state_dict()
        self._model_saved = True
        if not self.is_chief:
            return
        from trainpipe.training.builders import builder_reference

        builder_ref, code = builder_reference(builder if builder is not None else self.model_class(module))
        if input_example is None:
            input_example = self._default_example()
        import pandas as pd

        if not isinstance(input_example, pd.DataFrame) or len(input_example) == 0:
            raise InputError("save_model: input_example must be a non-empty DataFrame of raw feature columns")
        if classes is None and task == "classification" and self._tabular is not None:
            classes = list(self._tabular.classes)
        try:
            json.dumps(init_args or {})
        except TypeError as exc:
            raise InputError(f"save_model: init_args must be JSON-able: {exc}") from None
        from safetensors.torch import save

        weights = {k: v.detach().to("cpu").clone().contiguous() for k, v in state.items()}
        meta = {
            "format": loader.FORMAT,
            "framework": "torch",
            "builder": builder_ref,
            "init_args": init_args or {},
            "code": code,
            "task": task,
            "classes": list(classes or []),
            "feature_columns": [str(c) for c in input_example.columns],
            "label_column": self.settings.label_column,
            "split": {"test_fraction": self.settings.test_fraction, "seed": self.settings.seed, "method": "splitmix64"},
            "train_function": self.settings.train_function,
            "trained_with": self.settings.backend,
            "precision": self.settings.precision,
            "world_size": self.world_size,
            "device": self.device.type,
            "dist_backend": self.dist_name,
        }
        atomic_write_bytes(self.out / loader.WEIGHTS_FILE, save(weights))
        atomic_write_json(self.out / loader.META_FILE, meta)
        # prove now that it loads: rebuilt from the description, weights strict, predicting on the example
        try:
            loaded = loader.load(self.out, trusted=lambda m: True)
            output = loaded.predict_frame(input_example)
        except loader.ModelError as exc:
            raise InputError(f"save_model: the model cannot be rebuilt for serving: {exc}") from None
        except Exception as exc:
            raise InputError(f"save_model: the rebuilt model fails on input_example: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
        if task == "classification" and classes and output.shape[1] != 1 + len(classes):
            raise InputError(f"save_model: the model gives {output.shape[1] - 1} outputs but there are {len(classes)} classes")
        from trainpipe.serving.package import write_examples

        write_examples(self.out, input_example, output)

    def _default_example(self) -> Any:
        import pandas as pd

        source = self._tabular
        if source is not None and hasattr(source, "example"):
            return source.example()
        if source is not None:  # a stream: its first rows
            from trainpipe.tabular import read_row_group

            return read_row_group(source.groups[0], source.feature_columns).head(5).astype("float32")
        try:
            frame = self.data.frame()
        except InputError:
            raise InputError("save_model: give input_example (a DataFrame of raw feature rows): the data was not read through ctx.data") from None
        return pd.DataFrame(frame.drop(columns=[self.settings.label_column]).head(5))

    # --- the end --------------------------------------------------------------------------------

    def telemetry(self) -> dict[str, Any]:
        from trainpipe.training.digest import weights_digest

        state = {}
        for m in self._models:
            if self.strategy == "fsdp":
                from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

                sd = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True))  # every rank gets the whole
            else:
                sd = self.unwrap(m).state_dict()
            state.update({k: v.detach().float().cpu().numpy() for k, v in sd.items()})
        out = super().telemetry()
        out.update({
            "device": str(self.device),
            "threads": torch.get_num_threads(),
            "weights_sha256": weights_digest(state) if state else None,
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else platform.processor() or platform.machine(),
            "peak_device_mb": (torch.cuda.max_memory_allocated(self.device) / 2**20) if self.device.type == "cuda" else None,
            "profiler": self._profiler.finish() if self._profiler is not None else None,
            "gpu": self._gpu.finish() if self._gpu is not None else None,
        })
        return out

    def learning_rate(self) -> float | None:
        opt = self._optimizer
        if opt is None or not opt.param_groups:
            return None
        try:
            return float(opt.param_groups[0]["lr"])
        except (KeyError, TypeError, ValueError, RuntimeError):
            return None

    def device_figures(self) -> dict[str, Any]:
        if self.device.type != "cuda":
            return {}
        out: dict[str, Any] = {"peak_memory_bytes": float(torch.cuda.max_memory_allocated(self.device))}
        if self._gpu is not None:
            now = self._gpu.now()
            if now is not None:
                out["gpus"] = [now]
        return out

    def close(self) -> None:
        with contextlib.suppress(BaseException):  # a normal end waited already; a failing one reports its own error
            self._writer.wait()
        if self._hvd is not None:
            self._hvd.shutdown()
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _tracks_running_stats(model: torch.nn.Module) -> bool:
    """Whether ``model`` has normalization layers whose running statistics change while training."""
    from torch.nn.modules.batchnorm import _NormBase

    return any(isinstance(m, _NormBase) and m.track_running_stats for m in model.modules())


def _move(batch: Any, to: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        return to(batch)
    if isinstance(batch, dict):
        return {k: _move(v, to) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_move(v, to) for v in batch)
    return batch


class _CheckpointWriter:
    """One checkpoint in flight: waits for the DCP future on a thread, then finalizes (rank 0)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, future: Any, finalize: Callable[[], None] | None) -> None:
        def run() -> None:
            try:
                (future.result() if hasattr(future, "result") else future.upload_completion.result())
                if finalize is not None:
                    finalize()
            except BaseException as exc:  # re-raised in the training thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=run, name="trainpipe-checkpoint", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def _faulty_writer_class() -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    class FaultyWriter(FileSystemWriter):
        """DCP's file writer; with a ``kill_checkpoint`` fault, rank 0 dies after the data files are
        written and before the metadata is (a checkpoint torn half way)."""

        def __init__(self, path: str, fault: Any, step: int) -> None:
            super().__init__(path, sync_files=True)
            self._fault, self._step = fault, step

        def finish(self, metadata: Any, results: Any) -> None:
            self._fault.maybe_kill("kill_checkpoint", 0, self._step)
            super().finish(metadata, results)

    return FaultyWriter


def _FaultyWriter(path: str, fault: Any, step: int) -> Any:  # noqa: N802 (a class, built on first use)
    return _faulty_writer_class()(path, fault, step)


PROFILE_SKIP = 3  # steps before the profiler's warm-up step: the first steps are not steady


class _TorchProfile:
    """torch.profiler over a window of steps on rank 0: a Chrome trace, FLOPs and collective time."""

    def __init__(self, settings: Any, out: Path, device: torch.device) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        self.active = settings.profile_steps
        self.first = PROFILE_SKIP + 1
        self.trace = out / TELEMETRY_DIR / "trace_rank0.json"
        self.info: dict[str, Any] | None = None
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof = profile(activities=activities, schedule=schedule(wait=PROFILE_SKIP, warmup=1, active=self.active, repeat=1),
                            on_trace_ready=self._ready, with_flops=True)
        self.prof.start()

    def _ready(self, prof: Any) -> None:
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.trace))
        events = prof.key_averages()
        collective = [e for e in events if any(k in e.key.lower() for k in ("all_reduce", "allreduce", "gloo", "nccl", "broadcast", "reduce_scatter", "all_gather"))]
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
        self.info = {
            "trace": self.trace.name, "first_step_index": self.first, "steps": self.active,
            "flops_per_step": sum(int(e.flops or 0) for e in events) / self.active,
            "collective_ms_per_step": sum(e.cpu_time_total for e in collective) / 1000.0 / self.active,
            "top_ops": [{"name": e.key, "self_cpu_ms": e.self_cpu_time_total / 1000.0, "calls": int(e.count)} for e in top],
        }

    def step(self) -> None:
        self.prof.step()

    def finish(self) -> dict[str, Any] | None:
        self.prof.stop()
        return self.info


class _NvmlSampler:
    """GPU utilization and memory of this rank's device through NVML, sampled every 0.5 s in a thread."""

    def __init__(self, device: torch.device) -> None:
        self.util: list[float] = []
        self.mem: list[float] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._index = device.index or 0
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self._index)
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

    def now(self) -> dict[str, Any] | None:
        """This device's NVML readings now (utilization 0-1, memory in bytes, power in watts)."""
        if self._nvml is None:
            return None
        try:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            try:
                power = self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
            except Exception:  # noqa: BLE001 (not every board reports power)
                power = None
            return {"index": self._index, "utilization": rates.gpu / 100.0, "memory_used": float(info.used), "power": power}
        except Exception:  # noqa: BLE001 (telemetry never fails a run)
            return None

    def finish(self) -> dict[str, Any] | None:
        if self._nvml is None:
            return None
        self._stop.set()
        self._thread.join(timeout=2)
        if not self.util:
            return None
        return {"utilization_pct_mean": sum(self.util) / len(self.util), "memory_used_mb_max": max(self.mem), "samples": len(self.util)}
