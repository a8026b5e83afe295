"""Where a torch training's rows live, and how its batches reach the device.

- On a CPU, batches are gathered from the host arrays, as they are.
- On a GPU, in-memory rows that take at most ``device_data_share`` of the device's free memory
  move to the GPU once; a batch is then an ``index_select`` there, and each epoch's order is
  copied over once. The host does no per-batch work beyond launching it.
- Otherwise (rows too large to keep on the device, Parquet streams, map-style datasets), each
  batch is gathered into a pinned host buffer and copied to the device on a side stream one
  batch ahead, while the device computes the current one.

The order of batches, and where a resumed epoch picks up, do not depend on where the rows live.
Imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from trainpipe.contract.errors import InputError
from trainpipe.training.data import rank_batches, steps_per_epoch

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig

Fill = Callable[[Callable[[Any, tuple[int, ...], torch.dtype], torch.Tensor]], Any]


class AheadCopy:
    """Batches through a ring of pinned host buffers to the device, one ahead, on a side stream."""

    def __init__(self, device: torch.device, depth: int = 2) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._ring: list[dict[Any, torch.Tensor]] = [{} for _ in range(depth)]
        self._copied: list[Any] = [None] * depth

    def _buffer(self, slot: int) -> Callable[[Any, tuple[int, ...], torch.dtype], torch.Tensor]:
        held = self._ring[slot]

        def buffer(key: Any, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            buf = held.get(key)
            if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
                buf = held[key] = torch.empty(shape, dtype=dtype, pin_memory=True)
            return buf

        return buffer

    def _upload(self, slot: int, fill: Fill) -> tuple[Any, Any]:
        if self._copied[slot] is not None:
            self._copied[slot].synchronize()  # this slot's last copy has left its buffers (a batch ago)
        staged = fill(self._buffer(slot))
        with torch.cuda.stream(self.stream):
            on_device = _map(staged, lambda t: t.to(self.device, non_blocking=True))
            copied = torch.cuda.Event()
            copied.record(self.stream)
        self._copied[slot] = copied
        return on_device, copied

    def run(self, fills: Iterator[Fill]) -> Iterator[Any]:
        """The device batches of ``fills`` (each writes one host batch into the buffers it is given)."""
        slot = 0
        ahead = next(fills, None)
        pending = self._upload(slot, ahead) if ahead is not None else None
        while pending is not None:
            batch, copied = pending
            slot = (slot + 1) % len(self._ring)
            following = next(fills, None)
            pending = self._upload(slot, following) if following is not None else None
            current = torch.cuda.current_stream(self.device)
            current.wait_event(copied)

            def record(t: Any, s: Any = current) -> Any:  # made on the side stream, used on this one
                return t.record_stream(s)

            _map(batch, record)
            yield batch


def _map(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, fn) for v in obj)
    return obj


def _fill_from(batch: Any) -> Fill:
    """A host batch (numpy arrays or tensors, in any structure) copied into pinned buffers."""

    def fill(buffer: Callable[[Any, tuple[int, ...], torch.dtype], torch.Tensor]) -> Any:
        counter = iter(range(1 << 30))

        def one(x: Any) -> Any:
            t = torch.as_tensor(x)
            return buffer(next(counter), tuple(t.shape), t.dtype).copy_(t)

        return _map(_as_tensors(batch), one)

    return fill


def _as_tensors(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _as_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_as_tensors(v) for v in obj)
    return torch.as_tensor(obj) if hasattr(obj, "__array__") or isinstance(obj, torch.Tensor) else obj


class TorchPlacement:
    """A torch rank's :class:`~trainpipe.training.sources.Placement`.

    Attributes:
        where: ``host`` (CPU training), ``device`` (rows on the GPU) or ``pinned`` (batches copied
            ahead through pinned buffers); telemetry reports it.
    """

    def __init__(self, device: torch.device, share: float) -> None:
        self.device, self.share = device, share
        self.cuda = device.type == "cuda"
        self.where = "pinned" if self.cuda else "host"
        self._ahead = AheadCopy(device) if self.cuda else None

    def place(self, arrays: list[Any]) -> list[Any]:
        tensors = [torch.as_tensor(a) for a in arrays]
        if not self.cuda:
            return tensors
        need = sum(t.numel() * t.element_size() for t in tensors)
        free, _ = torch.cuda.mem_get_info(self.device)
        if self.share > 0 and need <= self.share * free:
            self.where = "device"
            return [t.to(self.device) for t in tensors]
        return tensors

    def gather(self, arrays: list[Any], rows: Any) -> Iterator[list[Any]]:
        index = torch.from_numpy(rows)
        if not self.cuda:  # index_select: the plain gather, without advanced indexing's general path
            for r in index:
                yield [a.index_select(0, r) for a in arrays]
        elif self.where == "device":
            on_device = index.pin_memory().to(self.device, non_blocking=True)  # the epoch's order, once
            for r in on_device:
                yield [a.index_select(0, r) for a in arrays]
        else:
            assert self._ahead is not None

            def fills() -> Iterator[Fill]:
                for r in index:

                    def fill(buffer: Callable[..., torch.Tensor], r: Any = r) -> list[torch.Tensor]:
                        return [
                            torch.index_select(a, 0, r, out=buffer(i, (len(r), *a.shape[1:]), a.dtype))
                            for i, a in enumerate(arrays)
                        ]

                    yield fill

            yield from self._ahead.run(fills())

    def from_host(self, batches: Iterator[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        if self._ahead is None:
            for batch in batches:
                yield _map(_as_tensors(batch), lambda t: t)
            return
        yield from self._ahead.run(_fill_from(b) for b in batches)

    def other(
        self, source: Any, settings: TrainModelConfig, rank: int, world: int
    ) -> tuple[int, Callable[[int, int], Iterator[Any]]]:
        """A map-style dataset (``__len__`` and ``__getitem__``): rows collated per batch."""
        if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
            raise InputError(
                f"train_function: ctx.batches cannot iterate a {type(source).__name__} "
                "(give TabularData, a ParquetStream, a tuple or dict of arrays, a map-style dataset or a StreamSource)"
            )
        from torch.utils.data import default_collate

        n = len(source)

        def mapped(epoch: int, skip: int) -> Iterator[Any]:
            def collated() -> Iterator[Any]:
                for idx in rank_batches(n, settings.batch_size, settings.seed, epoch, rank, world, skip):
                    items = (
                        source.__getitems__(idx.tolist())
                        if hasattr(source, "__getitems__")
                        else [source[int(i)] for i in idx]
                    )
                    yield default_collate(items)

            yield from self.from_host(collated())

        return steps_per_epoch(n, settings.batch_size), mapped
