"""What ``ctx.log`` records: each key's mean over an epoch's steps and every rank.

Logged values stay the framework's tensors where they are (no host copy, no device
synchronization per step); every :data:`FOLD_EVERY` values of a key are added up where they live,
and the sums come to the host once, when the ranks reduce them at an epoch's end (or before a
mid-epoch checkpoint, which carries the partial sums so a resumed run reports the same means).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from trainpipe.contract.errors import InputError

#: Logged values are kept as they are and added up this often.
FOLD_EVERY = 512


class HostValues:
    """How logged values are kept and added up when they are plain host numbers; a backend whose
    values are tensors gives its own (kept where they live, summed on the device)."""

    def keep(self, value: Any) -> Any:
        """What a logged value is kept as."""
        return value

    def fold(self, values: list[Any]) -> Any:
        """The sum of kept values, where they live."""
        return float(sum(float(v) for v in values))

    def to_float(self, value: Any) -> float:
        """A sum's value on the host (the only device synchronization, at reductions)."""
        return float(value)


class EpochMetrics:
    """Per-key sums and counts since the last reduction, the reduced sums carried through an
    epoch, and the epochs' mean lines (``history``).

    Args:
        world_size: Ranks taking part in the reductions.
        values: How logged values are kept and summed (:class:`HostValues`, or a backend's).
        all_reduce_sum: Sums a list of floats over every rank (a collective).
    """

    def __init__(
        self, world_size: int, values: HostValues, all_reduce_sum: Callable[[list[float]], list[float]]
    ) -> None:
        self.world_size = world_size
        self._keep, self._fold, self._to_float = values.keep, values.fold, values.to_float
        self._all_reduce_sum = all_reduce_sum
        self._pending: dict[str, list[Any]] = {}
        self._folded: dict[str, list[Any]] = {}  # key -> [sum (framework value), count] since the last reduction
        self.carried: dict[str, list[float]] = {}  # key -> [sum, count] over every rank, reduced before a checkpoint
        self.history: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}

    def log(self, values: dict[str, Any]) -> None:
        self.last.update(values)
        for key, value in values.items():
            pending = self._pending.setdefault(key, [])
            pending.append(self._keep(value))
            if len(pending) >= FOLD_EVERY:
                self._fold_key(key)

    def _fold_key(self, key: str) -> None:
        values = self._pending.get(key) or []
        if values:
            acc = self._folded.setdefault(key, [0.0, 0])
            acc[0] = acc[0] + self._fold(values)
            acc[1] += len(values)
            self._pending[key] = []

    def reduce(self) -> dict[str, list[float]]:
        """This epoch's sums since the last reduction, over every rank (a collective).

        Raises:
            InputError: the ranks logged different keys.
        """
        for key in list(self._pending):
            self._fold_key(key)
        keys = sorted(set(self._folded) | set(self.carried))
        digest = int(hashlib.sha256("\0".join(keys).encode()).hexdigest()[:8], 16)
        flat = [x for k in keys for x in self._host(self._folded.get(k))] + [float(digest)]
        total = self._all_reduce_sum(flat)
        if total[-1] != digest * self.world_size:
            raise InputError(
                "train_function: the ranks logged different keys with ctx.log; every rank must log the same ones"
            )
        self._folded = {}
        return {k: [total[2 * i], total[2 * i + 1]] for i, k in enumerate(keys)}

    def _host(self, acc: list[Any] | None) -> list[float]:
        return [0.0, 0.0] if acc is None else [self._to_float(acc[0]), float(acc[1])]

    def carry(self) -> None:
        """Reduce into the carried sums (before a mid-epoch checkpoint)."""
        for k, (s, c) in self.reduce().items():
            acc = self.carried.setdefault(k, [0.0, 0.0])
            acc[0] += s
            acc[1] += c

    def end_epoch(self, epoch: int, step: int) -> dict[str, Any]:
        """The epoch's line: every key's mean over its steps and ranks."""
        self.carry()
        means = {k: (s / c if c else float("nan")) for k, (s, c) in sorted(self.carried.items())}
        self.carried = {}
        line = {"epoch": epoch, "step": step, **means}
        self.history.append(line)
        return line

    def last_logged(self) -> dict[str, float]:
        """The newest value of each key, as numbers (live telemetry; a device value is read as it is)."""
        out = {}
        for key, value in list(self.last.items()):
            try:
                out[key] = float(value)
            except (TypeError, ValueError, RuntimeError):
                continue
        return out


def is_loss(key: str) -> bool:
    """Whether a logged key is a loss (``loss``, ``val_loss``, ``train_loss``): the values divergence is read on."""
    return key == "loss" or key.endswith("_loss")


def diverged(line: dict[str, Any]) -> dict[str, float]:
    """The losses of an epoch's line (see :func:`is_loss`) that are NaN or infinite."""
    import math

    return {
        k: float(v)
        for k, v in line.items()
        if is_loss(k) and isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)
    }


def diverged_at(history: list[dict[str, Any]]) -> int | None:
    """The first epoch (1-based) whose mean loss is NaN or infinite, else None: a training whose loss diverged
    ends all the same (its weights are what they are), and its result says from when."""
    for line in history:
        if diverged(line):
            return int(line.get("epoch", 0)) + 1
    return None
