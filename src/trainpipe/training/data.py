"""Training data: the snapshot as in-memory arrays or as a stream of Parquet row groups, and the
seeded, sharded, resumable order of batches. numpy, pandas and pyarrow only (every backend's
ranks share it; no ML framework here).

Two kinds of source feed :meth:`TrainContext.batches`:

- **in memory** (:class:`TabularData`, a tuple or dict of arrays, a map-style dataset): global
  batch *k* of an epoch is rows ``perm[kB:(k+1)B]`` of a permutation seeded by ``seed + epoch``
  (as ``DistributedSampler`` seeds), and rank *r* takes the *r*-th slice of ``B / world``. Any
  world size follows the trajectory of one process with batch *B*.
- **streamed** (:class:`ParquetStream`, or any object with ``batches_per_epoch`` and
  ``local_batches``): each rank reads its own row groups, a few at a time, so memory holds about
  two row groups and a batch whatever the dataset's size.

A source resumes mid-epoch from a batch count: nothing before it is read again.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trainpipe.contract.errors import InputError
from trainpipe.contract.text import plain

# --- the order of rows --------------------------------------------------------------------------


def steps_per_epoch(n_rows: int, batch_size: int) -> int:
    """Full global batches per epoch; the remainder is dropped so every rank's share is equal."""
    return n_rows // batch_size


def epoch_permutation(n_rows: int, seed: int, epoch: int) -> Any:
    """The global order of rows in an epoch: seeded by ``seed + epoch`` (as DistributedSampler does)."""
    import numpy as np

    return np.random.default_rng(seed + epoch).permutation(n_rows)


def rank_batches(
    n_rows: int, batch_size: int, seed: int, epoch: int, rank: int, world: int, start_step: int = 0
) -> Any:
    """Row indices of this rank's share of each global batch, from ``start_step`` on.

    Returns:
        An int64 array of shape ``(steps, batch_size / world)``.
    """
    steps = steps_per_epoch(n_rows, batch_size)
    local = batch_size // world
    perm = epoch_permutation(n_rows, seed, epoch)[: steps * batch_size].reshape(steps, world, local)
    return perm[start_step:, rank, :]


@runtime_checkable
class StreamSource(Protocol):
    """A source that reads its own shard (trainpipe's :class:`ParquetStream`, or a team's).

    ``batches_per_epoch`` must be the same on every rank (ranks step together); ``local_batches``
    yields tuples of arrays of ``local_batch`` rows, starting after ``skip`` batches of the epoch.
    """

    def batches_per_epoch(self, world: int, local_batch: int) -> int: ...

    def local_batches(
        self, epoch: int, rank: int, world: int, local_batch: int, seed: int, skip: int
    ) -> Iterator[tuple[Any, ...]]: ...


# --- the snapshot -------------------------------------------------------------------------------


class _Rows:
    """What every trainpipe data source tells a model: how many features in, how many outputs out."""

    feature_columns: list[str]
    task: str
    classes: list[Any]

    @property
    def n_features(self) -> int:
        return len(self.feature_columns)

    @property
    def n_outputs(self) -> int:
        return len(self.classes) if self.task == "classification" else 1


@dataclass
class TabularData(_Rows):
    """A table's training rows in memory: raw float32 features ``x`` and targets ``y`` (class
    indices for classification, float32 values for regression), with what a model needs to scale
    them and a served model needs to name its outputs."""

    x: Any
    y: Any
    feature_columns: list[str]
    label_column: str
    task: str
    classes: list[Any] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)
    target_mean: float = 0.0
    target_std: float = 1.0
    #: The first raw training rows, as read (their columns' types are what a served model takes).
    raw_example: Any = None

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def example(self, rows: int = 5) -> Any:
        """A few training rows as the raw feature DataFrame a served model takes, with the training
        frame's column types (the registered model's signature declares them)."""
        import pandas as pd

        if self.raw_example is not None:
            return self.raw_example.head(rows).reset_index(drop=True)
        return pd.DataFrame(self.x[:rows], columns=self.feature_columns)


def _moments(sums: Any, squares: Any, n: int) -> tuple[list[float], list[float]]:
    import numpy as np

    mean = sums / max(n, 1)
    std = np.sqrt(np.maximum(squares / max(n, 1) - mean**2, 0.0))
    std[std == 0] = 1.0
    return mean.tolist(), std.tolist()


def load_table(
    path: str | Path, label_column: str, task: str, test_fraction: float, seed: int, batch_size: int
) -> TabularData:
    """Read a dataset into memory: its training rows, checked against training's preconditions.

    Raises:
        InputError: naming the column and an offending row and value, or too few rows.
    """
    import numpy as np

    from trainpipe.data.preconditions import check_table, features_and_label
    from trainpipe.data.tabular import encode_labels, read_table, split_indices

    df = read_table(path, "data")
    cols, x, y_raw = features_and_label(df, label_column, task=task)
    check_table(df, label_column, task, batch_size, test_fraction, seed)
    train_idx, _ = split_indices(len(df), test_fraction, seed)
    xt = x[train_idx]
    mean, std = _moments(xt.astype(np.float64).sum(axis=0), (xt.astype(np.float64) ** 2).sum(axis=0), len(xt))
    data = TabularData(
        x=np.ascontiguousarray(xt),
        y=None,
        feature_columns=cols,
        label_column=label_column,
        task=task,
        mean=mean,
        std=std,
        raw_example=df.iloc[train_idx[:5]][cols].copy(),
    )
    if task == "classification":
        classes, y = encode_labels(y_raw)
        data.classes, data.y = classes, np.ascontiguousarray(y[train_idx])
    else:
        y = np.asarray(y_raw, dtype=np.float64)[train_idx]
        data.y = y.astype(np.float32)
        data.target_mean, data.target_std = float(y.mean()), float(y.std() or 1.0)
    if len(train_idx) < batch_size:
        raise InputError(f"batch_size: {batch_size} is larger than the {len(train_idx)} training rows")
    return data


class ParquetStream(_Rows):
    """The training rows of a Parquet dataset, read row group by row group.

    Row groups are dealt to ranks once (largest first, to the rank with the fewest rows), so
    every epoch has the same number of batches; each epoch shuffles the order of a rank's
    groups and the rows inside each group (seeded). At most two row groups (the one being
    batched and the next, read ahead on a thread) and one batch are in memory per rank.

    Args:
        path: A Parquet file or a directory of Parquet files.
        label_column, task, test_fraction, seed: As train_model's settings.
    """

    def __init__(self, path: str | Path, label_column: str, task: str, test_fraction: float, seed: int) -> None:
        import numpy as np

        from trainpipe.data.tabular import dataset_columns, held_out, row_groups

        self.path = Path(path)
        self.label_column, self.task, self.test_fraction, self.seed = label_column, task, test_fraction, seed
        self.groups = row_groups(self.path)
        columns = dataset_columns(self.path)
        if label_column not in columns:
            raise InputError(
                f"label_column: {label_column!r} is not a column of the data (columns: {', '.join(columns[:10])})"
            )
        self.feature_columns = [c for c in columns if c != label_column]
        self.train_rows = [
            int((~held_out(np.arange(g.first_row, g.first_row + g.rows), test_fraction, seed)).sum())
            for g in self.groups
        ]
        self.classes: list[Any] = []
        self.mean: list[float] = []
        self.std: list[float] = []
        self.target_mean, self.target_std = 0.0, 1.0
        self.rows = sum(g.rows for g in self.groups)
        self._shards: dict[int, list[list[int]]] = {}
        self._checked: set[int] = set()  # row groups whose rows passed the preconditions

    def _read(self, index: int) -> tuple[Any, Any]:
        """Training rows of row group ``index``: float32 features and raw labels (checked).

        A group is checked the first time it is read (by :meth:`scan`, before training): the
        snapshot does not change under a run, and the check costs more than decoding the group, so
        every epoch after the scan only decodes.
        """
        import numpy as np

        from trainpipe.data.preconditions import check_frame
        from trainpipe.data.tabular import held_out, read_row_group

        g = self.groups[index]
        df = read_row_group(g, self.feature_columns + [self.label_column])
        df.index = np.arange(g.first_row, g.first_row + g.rows)  # errors name dataset-wide rows
        if index not in self._checked:
            check_frame(df, self.label_column, self.task, self.feature_columns + [self.label_column])
            self._checked.add(index)
        keep = ~held_out(df.index.to_numpy(), self.test_fraction, self.seed)
        x = df[self.feature_columns].to_numpy(dtype=np.float32)[keep]
        return x, df[self.label_column].to_numpy()[keep]

    def scan(self, batch_size: int) -> ParquetStream:
        """One pass over every row group: check the preconditions, and learn the feature scaling
        and the classes (or the target's scaling). Returns self.

        Raises:
            InputError: a rule fails (naming the column, row and value), or too few rows.
        """
        import numpy as np

        from trainpipe.data.tabular import min_rows

        need = min_rows(batch_size, self.test_fraction, self.seed)
        if self.rows < need:
            raise InputError(
                f"data: {self.rows} rows, but batch_size {batch_size} with test_fraction {self.test_fraction} "
                f"(seed {self.seed}) needs at least {need}"
            )
        sums = np.zeros(self.n_features)
        squares = np.zeros(self.n_features)
        n, t_sum, t_sq = 0, 0.0, 0.0
        labels: set[Any] = set()
        for i in range(len(self.groups)):
            x, y = self._read(i)
            # float64 sums without a float64 copy of the group (a rank's memory stays near a group's)
            sums += x.sum(axis=0, dtype=np.float64)
            squares += np.einsum("ij,ij->j", x, x, dtype=np.float64)
            n += len(x)
            if self.task == "classification":
                labels.update(plain(v) for v in np.unique(y))
            else:
                yf = y.astype(np.float64)
                t_sum += float(yf.sum())
                t_sq += float((yf**2).sum())
        self.mean, self.std = _moments(sums, squares, n)
        if self.task == "classification":
            if len(labels) < 2:
                raise InputError(
                    f"label_column: {self.label_column!r} has a single class ({next(iter(labels), None)!r}); nothing "
                    "to learn"
                )
            self.classes = sorted(labels, key=lambda v: (str(type(v)), v))
        else:
            self.target_mean = t_sum / max(n, 1)
            self.target_std = math.sqrt(max(t_sq / max(n, 1) - self.target_mean**2, 0.0)) or 1.0
        return self

    def shards(self, world: int) -> list[list[int]]:
        """Row groups per rank: largest first, each to the rank with the fewest training rows so far."""
        if world not in self._shards:
            load = [0] * world
            out: list[list[int]] = [[] for _ in range(world)]
            for i in sorted(range(len(self.groups)), key=lambda k: (-self.train_rows[k], k)):
                r = min(range(world), key=lambda k: (load[k], k))
                out[r].append(i)
                load[r] += self.train_rows[i]
            self._shards[world] = [sorted(s) for s in out]
        return self._shards[world]

    def batches_per_epoch(self, world: int, local_batch: int) -> int:
        return min(sum(self.train_rows[i] for i in shard) for shard in self.shards(world)) // local_batch

    def _encode(self, y: Any) -> Any:
        import numpy as np
        import pandas as pd

        if self.task == "regression":
            return y.astype(np.float32)
        codes = pd.Categorical(y, categories=self.classes).codes
        if (codes < 0).any():
            raise InputError(f"data: labels the model never saw: {plain(y[codes < 0][0])!r}")
        return codes.astype(np.int64)

    def local_batches(
        self, epoch: int, rank: int, world: int, local_batch: int, seed: int, skip: int
    ) -> Iterator[tuple[Any, Any]]:
        """This rank's batches of ``local_batch`` rows in epoch ``epoch``, after the first ``skip``."""
        import numpy as np

        if not self.classes and self.task == "classification":
            raise InputError("data: call scan() before streaming a classification dataset (it learns the classes)")
        total = self.batches_per_epoch(world, local_batch)
        rng = np.random.default_rng([seed, epoch, rank])
        order = [self.shards(world)[rank][k] for k in rng.permutation(len(self.shards(world)[rank]))]
        # skip whole groups without reading them
        start_row = skip * local_batch
        first = 0
        while first < len(order) and start_row >= self.train_rows[order[first]]:
            start_row -= self.train_rows[order[first]]
            first += 1
        ahead = _ReadAhead(self._read, order[first:])
        cur_x = cur_y = None
        pos, emitted = 0, skip
        for gi, (x, y) in zip(order[first:], ahead, strict=True):
            perm = np.random.default_rng([seed, epoch, gi]).permutation(len(x))[start_row:]
            start_row = 0
            nx, ny = x[perm], self._encode(y[perm])
            if (
                cur_x is not None and cur_y is not None and pos < len(cur_x)
            ):  # the last group's remainder starts the next batch
                nx, ny = np.concatenate([cur_x[pos:], nx]), np.concatenate([cur_y[pos:], ny])
            cur_x, cur_y, pos = nx, ny, 0
            while len(cur_x) - pos >= local_batch and emitted < total:
                # copies: a batch kept by the caller must not keep its whole row group alive
                yield cur_x[pos : pos + local_batch].copy(), cur_y[pos : pos + local_batch].copy()
                pos += local_batch
                emitted += 1
            if emitted >= total:
                ahead.close()
                return


class _ReadAhead:
    """Yield ``read(i)`` for each index, reading the next one on a thread while the caller works."""

    def __init__(self, read: Any, indices: list[int]) -> None:
        self.read, self.indices = read, indices
        self._next: tuple[threading.Thread, list[Any]] | None = None
        self._closed = False

    def _start(self, i: int) -> None:
        box: list[Any] = []

        def work() -> None:
            try:
                box.append(("ok", self.read(i)))
            except BaseException as exc:  # re-raised in the consumer
                box.append(("error", exc))

        t = threading.Thread(target=work, name="trainpipe-readahead", daemon=True)
        t.start()
        self._next = (t, box)

    def __iter__(self) -> Iterator[Any]:
        if not self.indices:
            return
        self._start(self.indices[0])
        for k in range(len(self.indices)):
            assert self._next is not None
            thread, box = self._next
            thread.join()
            if k + 1 < len(self.indices) and not self._closed:
                self._start(self.indices[k + 1])
            kind, value = box[0]
            if kind == "error":
                raise value
            yield value
            if self._closed:
                return

    def close(self) -> None:
        self._closed = True


class Snapshot:
    """The dataset train_model was given, as a training function reads it (``ctx.data``).

    Attributes:
        path: The dataset: one CSV/Parquet file or a directory of Parquet files.
        label_column, task: From the settings.
        streamed: Whether :meth:`load` streams it (a directory of Parquet files).
    """

    def __init__(
        self, path: str | Path, label_column: str, task: str, test_fraction: float, seed: int, batch_size: int
    ) -> None:
        from trainpipe.data.tabular import find_dataset

        self.path = find_dataset(path, "data")
        self.label_column, self.task = label_column, task
        self.test_fraction, self.seed, self.batch_size = test_fraction, seed, batch_size
        self.streamed = self.path.is_dir()
        #: The rows it last gave the function (their classes and example describe the saved model, whatever
        #: arrays the function then made of them).
        self.given: TabularData | ParquetStream | None = None

    def table(self) -> TabularData:
        """The training rows in memory, checked."""
        self.given = load_table(self.path, self.label_column, self.task, self.test_fraction, self.seed, self.batch_size)
        return self.given

    def stream(self) -> ParquetStream:
        """The training rows of a Parquet dataset as a stream, scanned (checked, scaling and classes learnt)."""
        self.given = ParquetStream(self.path, self.label_column, self.task, self.test_fraction, self.seed).scan(
            self.batch_size
        )
        return self.given

    def load(self) -> TabularData | ParquetStream:
        """:meth:`stream` for a directory of Parquet files, else :meth:`table`."""
        return self.stream() if self.streamed else self.table()

    def frame(self) -> Any:
        """The training rows as a pandas DataFrame (every column), for a function that prepares its own features."""
        from trainpipe.data.tabular import read_table, split_indices

        df = read_table(self.path, "data")
        train_idx, _ = split_indices(len(df), self.test_fraction, self.seed)
        return df.iloc[train_idx].reset_index(drop=True)


def example_rows(source: Any, snapshot: Snapshot, label_column: str) -> Any:
    """A few raw feature rows for a saved model's example: from trainpipe's data source (a table, or
    a stream's first row group), else the snapshot itself.

    Raises:
        InputError: the function read its data some other way and gave no example.
    """
    import pandas as pd

    if source is not None and hasattr(source, "example"):
        return source.example()
    if source is not None:  # a stream: its first rows
        from trainpipe.data.tabular import read_row_group

        return read_row_group(source.groups[0], source.feature_columns).head(5)  # with their types, as read
    try:
        frame = snapshot.frame()
    except InputError:
        raise InputError(
            "save_model: give input_example (a DataFrame of raw feature rows): the data was not read through ctx.data"
        ) from None
    return pd.DataFrame(frame.drop(columns=[label_column]).head(5))
