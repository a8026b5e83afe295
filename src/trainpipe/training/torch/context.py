"""The training context for PyTorch: DDP (gloo or NCCL), FSDP2 and Horovod.

The context is what a training function calls; the parts it composes each do one job:
:mod:`~trainpipe.training.torch.strategies` (the backend's communication and wrapping),
:mod:`~trainpipe.training.torch.data` (where rows live, batches to the device),
:mod:`~trainpipe.training.torch.state` (the checkpoint state, staged and written in the
background), :mod:`~trainpipe.training.torch.timing` (step times without device
synchronization), :mod:`~trainpipe.training.torch.model` (the saved model) and
:mod:`~trainpipe.training.torch.profiling`. Nothing in a step waits for the device.
"""

from __future__ import annotations

import contextlib
import platform
from typing import TYPE_CHECKING, Any

import torch

from trainpipe.contract.errors import InputError
from trainpipe.training import sources
from trainpipe.training.backends import BACKENDS
from trainpipe.training.checkpoint import StateIO
from trainpipe.training.context import BaseContext
from trainpipe.training.metrics import HostValues
from trainpipe.training.timing import StepTimer
from trainpipe.training.torch.strategies import TorchStrategy

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig


class TorchValues(HostValues):
    """Logged tensors stay on their device: detached when logged, summed there, read at reductions."""

    def keep(self, value: Any) -> Any:
        return value.detach() if isinstance(value, torch.Tensor) else float(value)

    def fold(self, values: list[Any]) -> Any:
        """The sum where the values live: a device tensor stays on the device (no synchronization). Scalars
        of one dtype (a loss, every step) are stacked and summed in float64 in three operations, not two
        per value."""
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        rest = float(sum(v for v in values if not isinstance(v, torch.Tensor)))
        if not tensors:
            return rest
        first = tensors[0]
        if all(t.dim() == 0 and t.dtype == first.dtype and t.device == first.device for t in tensors):
            return torch.stack(tensors).sum(dtype=torch.float64) + rest
        return torch.stack([v.reshape(()).double() for v in tensors]).sum() + rest


def resolve_device(settings: TrainModelConfig, local_rank: int) -> torch.device:
    use_cuda = settings.device == "cuda" or (settings.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
        exact_cudnn()
        return device
    return torch.device("cpu")


def exact_cudnn() -> None:
    """cuDNN's deterministic algorithms only, and no autotuning: a resumed run reaches an uninterrupted run's
    very weights only if the same steps give the same bits. cuDNN's default choice for a convolution's
    backward pass may sum with atomics (a different order, different low bits, each run), and autotuning may
    pick another algorithm in another process: a team's 1-D CNN resumed after SIGTERM on an H200 ended with
    other weights than its uninterrupted run (2026-11-28), where an MLP's resume matched. A function that
    wants autotuning back sets ``torch.backends.cudnn.benchmark`` itself, trading exact resume for it."""
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


class TorchContext(BaseContext):
    """``ctx`` of a PyTorch training function.

    A function prepares its model, makes its optimizer, registers both with :meth:`restore`,
    iterates :meth:`batches`, and per batch runs the forward pass under :meth:`autocast`, then
    :meth:`backward` and :meth:`step`; :meth:`log` records what to report; :meth:`save_model`
    writes the model at the end. Everything else (sharding, checkpoints, exact resume, restarts,
    preemption, collective timeouts, telemetry, fault injection) is the context's.

    Attributes:
        device: This rank's ``torch.device``.
        strategy: ``ddp``, ``fsdp`` or ``horovod``.
        precision: ``fp32``, ``bf16`` or ``fp16``.
    """

    framework = "torch"

    def __init__(self, settings: TrainModelConfig) -> None:
        self._strategy: TorchStrategy = BACKENDS[settings.backend].strategy_class()(settings)
        self.strategy = self._strategy.name
        self.precision = settings.precision
        rank, world, local = self._strategy.ranks()
        self.device = resolve_device(settings, local)
        dist_name = self._strategy.start(self.device, rank, world)
        super().__init__(settings, rank, world, local, dist_name)
        self._amp = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[settings.precision]
        self.scaler = torch.amp.GradScaler("cuda") if self._amp == torch.float16 else None
        self._models: list[torch.nn.Module] = []
        self._optimizer: torch.optim.Optimizer | None = None
        self._rows: sources.Placement | None = None
        from trainpipe.training.torch.profiling import NvmlSampler, TorchProfile

        self._profiler = (
            TorchProfile(settings, self.out, self.device) if settings.profile_steps and self.is_chief else None
        )
        self._gpu = NvmlSampler(self.device) if self.device.type == "cuda" else None

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
        model = self._strategy.wrap(model, self.device, self.world_size, forward_sync_buffers)
        self._models.append(model)
        return model

    unwrap = staticmethod(TorchStrategy.unwrap)

    def autocast(self) -> Any:
        """The forward pass's precision: autocast to bf16/fp16, or nothing for fp32."""
        if self._amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._amp)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled for fp16, timed apart from the forward pass."""
        self.timer.mark("backward_start")
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        self.timer.mark("backward_end")

    def step(
        self, optimizer: torch.optim.Optimizer, clip_grad_norm: float | None = None, zero_grad: bool = True
    ) -> None:
        """One optimizer step: gradients averaged over ranks (Horovod), unscaled and clipped when
        asked, ``optimizer.step()``, then ``zero_grad``. Counts the step (checkpoints follow it).
        Nothing here waits for the device."""
        self.timer.mark("step_start")
        self._optimizer = optimizer
        self._strategy.before_optimizer(optimizer)
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
        self.timer.mark("step_end")
        self._count_step()

    def peer_failure(self, exc: BaseException) -> bool:
        return self._strategy.peer_failure(exc)

    # --- reductions -----------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """``tensor`` summed (``op="sum"``) or averaged (``"mean"``) over every rank; a new tensor."""
        if op not in ("sum", "mean"):
            raise InputError(f"train_function: ctx.all_reduce op must be 'sum' or 'mean', not {op!r}")
        t = tensor.detach().clone()
        if self.world_size > 1:
            t = self._strategy.all_reduce(t)
        return t / self.world_size if op == "mean" else t

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        return self._strategy.host_sum(values)

    def _logged_values(self) -> HostValues:
        return TorchValues()

    # --- data, timing, state --------------------------------------------------------------------

    def _placement(self) -> sources.Placement:
        from trainpipe.training.torch.data import TorchPlacement

        if self._rows is None:
            self._rows = TorchPlacement(self.device, self.settings.device_data_share)
        return self._rows

    def _timer(self) -> StepTimer:
        if self.device.type != "cuda":
            return super()._timer()
        from trainpipe.training.torch.timing import CudaTimer

        return CudaTimer(self.framework, self._t0, self.device)

    def _state_io(self, objects: dict[str, Any]) -> StateIO:
        from trainpipe.training.torch.state import TorchState

        return TorchState(
            objects, self._strategy, self.device, self.scaler, self.rank, self.is_chief, self.fault, self._barrier
        )

    def _on_batch_end(self) -> None:
        if self._profiler is not None:
            self._profiler.step()

    # --- the model ------------------------------------------------------------------------------

    def _save_model(
        self,
        model: torch.nn.Module,
        input_example: Any,
        init_args: dict[str, Any] | None,
        builder: Any,
        classes: list[Any] | None,
        task: str,
    ) -> None:
        from trainpipe.training.torch import model as torch_model

        state = self._strategy.full_state(model, cpu=True)  # FSDP2 gathers the shards: every rank takes part
        if not self.is_chief:
            return
        shared, staged = self._checkpointed_weights(state)
        if input_example is None:
            from trainpipe.training.data import example_rows

            input_example = example_rows(self._source_rows(), self.data, self.settings.label_column)
        classes = self._classes(classes, task)
        s = self.settings
        meta = {
            "label_column": s.label_column,
            "split": {"test_fraction": s.test_fraction, "seed": s.seed, "method": "splitmix64"},
            "train_function": s.train_function,
            "trained_with": s.backend,
            "precision": s.precision,
            "world_size": self.world_size,
            "device": self.device.type,
            "dist_backend": self.dist_name,
        }
        torch_model.write_model(
            self.out,
            state,
            self.unwrap(model),
            meta,
            input_example,
            init_args,
            builder,
            classes,
            task,
            shared=shared,
            host_copy=staged,
        )

    def _checkpointed_weights(self, state: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
        """The last checkpoint's weights file and its host copy, where ``state`` is exactly what that
        checkpoint holds (the same tensors, unchanged since it was staged: a model saved after the run's
        last step); else ``(None, None)``. The model is then that file under a second name."""
        from trainpipe.training.checkpoint import checkpoint_name
        from trainpipe.training.torch.state import WEIGHTS_SUFFIX, TorchState

        ckpt = self.checkpoints
        io = ckpt.io if ckpt is not None else None
        if not isinstance(io, TorchState) or ckpt is None or ckpt.last_step != self.global_step:
            return None, None
        name = io.unchanged_weights(state)
        if name is None:
            return None, None
        self.wait_for_checkpoints()  # its file is on disk and its host copy landed
        path = ckpt.directory / checkpoint_name(self.global_step) / f"{name}{WEIGHTS_SUFFIX}"
        return (path, io.staged_weights[name]) if path.is_file() else (None, None)

    # --- the end --------------------------------------------------------------------------------

    def telemetry(self) -> dict[str, Any]:
        from trainpipe.training.digest import weights_digest

        state = {}
        for m in self._models:
            full = self._strategy.full_state(m, cpu=False)  # every rank gets the whole
            full = self._host_copy(full) or full
            state.update({k: v.detach().float().cpu().numpy() for k, v in full.items()})
        out = super().telemetry()
        cuda = self.device.type == "cuda"
        out.update(
            {
                "device": str(self.device),
                "threads": torch.get_num_threads(),
                "weights_sha256": weights_digest(state) if state else None,
                "device_name": torch.cuda.get_device_name(self.device)
                if cuda
                else platform.processor() or platform.machine(),
                "peak_device_mb": (torch.cuda.max_memory_allocated(self.device) / 2**20) if cuda else None,
                "rows_on": self._rows.where if self._rows is not None else None,
                "profiler": self._profiler.finish() if self._profiler is not None else None,
                "gpu": self._gpu.finish() if self._gpu is not None else None,
                "torch": torch.__version__,
            }
        )
        return out

    def _host_copy(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """The last checkpoint's host copy of ``state`` where ``state`` has not changed since (a run's end):
        its digest is then taken without a second copy of a GPU's weights to the host."""
        from trainpipe.training.torch.state import TorchState

        io = self.checkpoints.io if self.checkpoints is not None else None
        if not isinstance(io, TorchState):
            return None
        name = io.unchanged_weights(state)
        if name is None:
            return None
        io.stager.wait()  # the copies have landed (a rank that writes nothing never waited for them)
        return io.staged_weights[name]

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
        super().close()
        self._strategy.close()
