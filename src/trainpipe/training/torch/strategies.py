"""How each torch backend spreads a model over ranks: one strategy class per backend.

A strategy starts the ranks' communication, wraps the model, averages gradients where the
wrapper does not, sums host numbers over ranks (never waiting for a device), and tells the
checkpoint writer how its collectives run. The backend table (:mod:`trainpipe.training.backends`)
names each backend's class. Imports torch.

Written for the torch a team already has (2.6 and later): an argument that only newer torch
takes is passed only where it exists (:func:`ddp_wrap`).
"""

from __future__ import annotations

import functools
import inspect
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from trainpipe.contract.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig

#: The file a node's ranks rendezvous through when trainpipe starts them (a fresh one each start).
STORE_FILE_ENV = "TRAINPIPE_STORE_FILE"


def _attempt_store(rank: int, timeout: timedelta) -> Any:
    """The rendezvous store, under a prefix of its own for each restart of the group: a restarted
    rank must not dial the address a dead peer published in the previous attempt."""
    import torch.distributed as dist

    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=not agent_hosts and rank == 0,
        timeout=timeout,
        wait_for_workers=False,
    )
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    return dist.PrefixStore(f"trainpipe/{run_id}/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)


def tracks_running_stats(model: torch.nn.Module) -> bool:
    """Whether ``model`` has normalization layers whose running statistics change while training."""
    from torch.nn.modules.batchnorm import _NormBase

    return any(isinstance(m, _NormBase) and m.track_running_stats for m in model.modules())


def cpu_fsdp_supported() -> bool:
    """Whether this torch trains FSDP2 on CPU as DDP does. Measured here: 2.6 fails (its CPU streams
    lack the events FSDP2 records), 2.7 and 2.8 run but end 0.2 away from DDP's weights on the
    same run, 2.9 and later match DDP within 1e-5."""
    major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 9)


def ddp_wrap(model: torch.nn.Module, device: torch.device, sync_buffers: bool) -> torch.nn.Module:
    """``DistributedDataParallel`` that sends buffers before each forward pass only when asked.

    torch 2.13 names this ``forward_sync_buffers`` (and still sends rank 0's buffers once, when
    it wraps); older torch has ``broadcast_buffers``, whose ``False`` skips that first send too, so
    rank 0's buffers are broadcast here instead: every rank starts with them either way.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=sync_buffers)
    if not sync_buffers:
        with torch.no_grad():
            for buf in model.buffers():
                dist.broadcast(buf, src=0)
    return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=sync_buffers)


class TorchStrategy:
    """What every torch strategy does (DDP's defaults)."""

    name = ""

    def __init__(self, settings: TrainModelConfig) -> None:
        self.settings = settings

    # --- the ranks ------------------------------------------------------------------------------

    def ranks(self) -> tuple[int, int, int]:
        """``(rank, world size, local rank)`` of this process."""
        return (
            int(os.environ.get("RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)),
        )

    def start(self, device: torch.device, rank: int, world: int) -> str:
        """Start communication; returns the name of what carries it (nccl, gloo, horovod-gloo, ...)."""
        raise NotImplementedError

    def close(self) -> None:
        """End communication."""

    def peer_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a collective that failed because a peer died or hung (the group restarts)."""
        import torch.distributed as dist

        if isinstance(exc, getattr(dist, "DistError", ())):
            return True
        text = str(exc)
        return isinstance(exc, RuntimeError) and any(
            k in text for k in ("gloo", "NCCL", "Connection reset", "Connection closed", "timed out", "Timed out")
        )

    # --- the model ------------------------------------------------------------------------------

    def wrap(
        self, model: torch.nn.Module, device: torch.device, world: int, forward_sync_buffers: bool | None
    ) -> torch.nn.Module:
        """The model on its device, wrapped so that its gradients are averaged over ranks."""
        raise NotImplementedError

    def before_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Put averaged gradients in place where the wrapper does not (Horovod)."""

    @staticmethod
    def unwrap(model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside a DDP wrapper (FSDP2 and Horovod do not wrap)."""
        return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model

    def full_state(self, model: torch.nn.Module, cpu: bool) -> dict[str, torch.Tensor]:
        """Every parameter and buffer of the model, whole (collective under FSDP2: call on every rank)."""
        return self.unwrap(model).state_dict()

    # --- reductions -----------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over every rank, in place, where it lives."""
        raise NotImplementedError

    def host_sum(self, values: list[float]) -> list[float]:
        """Host numbers summed over every rank, never waiting for a device."""
        raise NotImplementedError

    # --- checkpoints ----------------------------------------------------------------------------

    def dcp_save(self, chief: bool) -> dict[str, Any] | None:
        """How this rank takes part in a DCP save on the writer thread (its keyword arguments), or
        None when it writes nothing (a Horovod replica)."""
        raise NotImplementedError

    def dcp_load(self) -> dict[str, Any]:
        raise NotImplementedError

    #: Every rank holds the whole model (no sharding): a checkpoint's weights can be one plain file.
    whole_model = True

    @property
    def rng_files_before_rename(self) -> bool:
        """Whether the ranks must meet (a barrier on the loop's thread) before the chief renames a
        checkpoint: true where no collective of the write orders every rank's RNG file before it."""
        return False


class DDPStrategy(TorchStrategy):
    """DistributedDataParallel over torch.distributed (NCCL on GPUs, gloo on CPUs)."""

    name = "ddp"

    def __init__(self, settings: TrainModelConfig) -> None:
        super().__init__(settings)
        self._host_group: Any = None  # host numbers, on the loop's thread
        self._ckpt_group: Any = None  # the checkpoint writer's collectives, on its thread

    def start(self, device: torch.device, rank: int, world: int) -> str:
        import torch.distributed as dist

        s = self.settings
        backend = s.dist_backend if s.dist_backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        timeout = timedelta(seconds=s.collective_timeout_s)
        if os.environ.get(STORE_FILE_ENV):  # one node, ranks started by trainpipe: a file for a store
            store = dist.FileStore(os.environ[STORE_FILE_ENV], world)
            store.set_timeout(timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        elif "MASTER_ADDR" in os.environ:  # torchrun across nodes
            dist.init_process_group(
                backend, store=_attempt_store(rank, timeout), rank=rank, world_size=world, timeout=timeout
            )
        else:  # one process (by hand, or nproc_per_node 1): the same choice as any world size, nccl on cuda
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        # host numbers and the checkpoint writer each get a gloo group of their own: two threads
        # must never issue collectives on one group, and host numbers never wait for a GPU
        self._host_group = dist.new_group(backend="gloo", timeout=timeout)
        self._ckpt_group = dist.new_group(backend="gloo", timeout=timeout)
        return backend

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def wrap(
        self, model: torch.nn.Module, device: torch.device, world: int, forward_sync_buffers: bool | None
    ) -> torch.nn.Module:
        model = model.to(device)
        if world == 1:
            return model
        return ddp_wrap(
            model, device, tracks_running_stats(model) if forward_sync_buffers is None else forward_sync_buffers
        )

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(tensor)
        return tensor

    def host_sum(self, values: list[float]) -> list[float]:
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        if dist.get_world_size() > 1:
            dist.all_reduce(t, group=self._host_group)
        return t.tolist()

    def dcp_save(self, chief: bool) -> dict[str, Any] | None:
        return {"process_group": self._ckpt_group}

    def dcp_load(self) -> dict[str, Any]:
        return {"process_group": self._ckpt_group}


class FSDPStrategy(DDPStrategy):
    """FSDP2: every child that holds parameters is sharded (``fully_shard``), then the root."""

    name = "fsdp"
    whole_model = False  # sharded: the weights stay in the DCP files, each rank writing its shard

    def wrap(
        self, model: torch.nn.Module, device: torch.device, world: int, forward_sync_buffers: bool | None
    ) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        if device.type == "cpu" and not cpu_fsdp_supported():
            raise InputError(
                f"backend: torch_fsdp on CPU needs torch 2.9 or later (before it FSDP2 on gloo does not train as DDP "
                "does); "
                f"this rank has torch {torch.__version__}: use torch_ddp on CPU, or train on a GPU"
            )
        model = model.to(device)
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child)
        fully_shard(model)
        return model

    def full_state(self, model: torch.nn.Module, cpu: bool) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu))


class HorovodStrategy(TorchStrategy):
    """Horovod's PyTorch binding: rank 0's parameters broadcast, each gradient's average started as
    soon as backward has it (as Horovod's DistributedOptimizer does) and awaited before the step."""

    name = "horovod"

    def __init__(self, settings: TrainModelConfig) -> None:
        super().__init__(settings)
        import warnings

        import horovod.torch as hvd

        # DCP says so each time it saves or loads without a torch process group: here that is the design
        warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled|unavailable)")
        hvd.init()
        self.hvd = hvd
        self._averaging: dict[torch.nn.Parameter, Any] = {}  # a parameter's gradient average in flight
        self._wrapped = 0

    def ranks(self) -> tuple[int, int, int]:
        os.environ["RANK"] = str(self.hvd.rank())
        return self.hvd.rank(), self.hvd.size(), self.hvd.local_rank()

    def start(self, device: torch.device, rank: int, world: int) -> str:
        return "horovod-nccl" if device.type == "cuda" else "horovod-gloo"

    def close(self) -> None:
        self.hvd.shutdown()

    def peer_failure(self, exc: BaseException) -> bool:
        return type(exc).__name__ == "HorovodInternalError" or super().peer_failure(exc)

    def wrap(
        self, model: torch.nn.Module, device: torch.device, world: int, forward_sync_buffers: bool | None
    ) -> torch.nn.Module:
        model = model.to(device)
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        index, self._wrapped = self._wrapped, self._wrapped + 1

        def started(name: str, param: torch.nn.Parameter) -> None:
            earlier = self._averaging.pop(param, None)
            if earlier is not None:  # a second backward before the step (accumulation): average the sum
                self.hvd.synchronize(earlier)  # every rank does the same: nothing is left in flight
            self._averaging[param] = self.hvd.allreduce_async(param.grad, op=self.hvd.Average, name=name)

        for name, param in model.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(functools.partial(started, f"trainpipe.grad.{index}.{name}"))
        return model

    def before_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Each gradient's average (started during backward) in place; any the hooks did not see
        (parameters of a model not given to ``prepare``) averaged at once."""
        rest = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                pending = self._averaging.pop(p, None)
                if pending is not None:
                    p.grad.copy_(self.hvd.synchronize(pending))
                elif p.grad is not None:
                    rest.append(p.grad)
        if rest:
            self.hvd.grouped_allreduce_(rest, op=self.hvd.Average)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=f"ctx.all_reduce.{tensor.numel()}")

    def host_sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        if self.hvd.size() == 1:
            return t.tolist()
        return self.hvd.allreduce(t, op=self.hvd.Sum, name=f"trainpipe.sums.{len(values)}").tolist()

    def dcp_save(self, chief: bool) -> dict[str, Any] | None:
        # no torch process group: DCP saves as one process (inferred: torch before 2.7 has no
        # no_dist argument), and the replicas' state is rank 0's
        return {} if chief else None

    def dcp_load(self) -> dict[str, Any]:
        return {}

    @property
    def rng_files_before_rename(self) -> bool:
        return True


#: The torch strategy of each backend name.
