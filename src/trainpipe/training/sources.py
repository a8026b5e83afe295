"""What ``ctx.batches`` iterates: a source turned into batches per epoch and a function that yields
this rank's batches of an epoch, resumed after a number of them, on the rank's device.

The order is :mod:`trainpipe.training.data`'s; where the rows live and how a batch reaches the
device is the backend's (:class:`Placement`): the torch context keeps in-memory rows on the GPU
when they fit, or in pinned host memory with the next batch copied ahead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from trainpipe.contract.errors import InputError
from trainpipe.training.data import ParquetStream, StreamSource, TabularData, rank_batches, steps_per_epoch

if TYPE_CHECKING:  # pragma: no cover
    from trainpipe.training.settings import TrainModelConfig

Iterate = Callable[[int, int], Iterator[Any]]


class Placement(Protocol):
    """A backend's part: where rows live and how batches reach the device."""

    #: Where the rows live: ``host``, ``pinned`` or ``device`` (each rank's telemetry reports it).
    where: str

    def place(self, arrays: list[Any]) -> list[Any]:
        """In-memory arrays where batches are gathered from (host, pinned host, device)."""

    def gather(self, arrays: list[Any], rows: Any) -> Iterator[list[Any]]:
        """One list of batch arrays per row of ``rows`` (an epoch's index matrix, numpy)."""

    def from_host(self, batches: Iterator[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        """Host batches (numpy or tensors) as device batches, in the same order."""

    def other(self, source: Any, settings: TrainModelConfig, rank: int, world: int) -> tuple[int, Iterate]:
        """A source only this backend iterates (torch: a map-style dataset)."""


def plan(source: Any, placement: Placement, settings: TrainModelConfig, rank: int, world: int) -> tuple[int, Iterate]:
    """``(batches per epoch, iterate)`` of a source, where ``iterate(epoch, skip)`` yields this
    rank's batches of ``epoch`` after its first ``skip``, on the device.

    Raises:
        InputError: arrays of different lengths, or a source no backend iterates.
    """
    local = settings.batch_size // world
    if isinstance(source, StreamSource) and not isinstance(source, (tuple, list, dict)):

        def stream(epoch: int, skip: int) -> Iterator[Any]:
            yield from placement.from_host(source.local_batches(epoch, rank, world, local, settings.seed, skip))

        return source.batches_per_epoch(world, local), stream
    if isinstance(source, TabularData):
        source = (source.x, source.y)
    if not isinstance(source, (tuple, list, dict)):
        return placement.other(source, settings, rank, world)
    keys = list(source) if isinstance(source, dict) else None
    arrays = placement.place([source[k] for k in keys] if keys else list(source))
    lengths = {int(a.shape[0]) for a in arrays}
    if len(lengths) != 1:
        raise InputError(f"train_function: ctx.batches got arrays of different lengths {sorted(lengths)}")
    n = lengths.pop()

    def in_memory(epoch: int, skip: int) -> Iterator[Any]:
        rows = rank_batches(n, settings.batch_size, settings.seed, epoch, rank, world, skip)
        for picked in placement.gather(arrays, rows):
            yield dict(zip(keys, picked, strict=True)) if keys else tuple(picked)

    return steps_per_epoch(n, settings.batch_size), in_memory


def is_trainpipe_rows(source: Any) -> bool:
    """Whether a source is trainpipe's own (its classes and an example row serve the saved model)."""
    return isinstance(source, (TabularData, ParquetStream))
