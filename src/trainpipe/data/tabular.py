"""Tabular data shared by every component that reads a dataset.

A dataset is one CSV or Parquet file, or a directory of Parquet files (read in name order, row
groups in file order; that order numbers the rows). pandas and pyarrow are imported inside the
functions: importing this module is cheap.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.contract.errors import InputError
from trainpipe.contract.layout import MARKER
from trainpipe.contract.text import plain

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

PARQUET_SUFFIXES = (".parquet", ".pq")
SUPPORTED_SUFFIXES = (".csv", *PARQUET_SUFFIXES)


def _data_files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in SUPPORTED_SUFFIXES)


def _is_parquet_dir(folder: Path) -> bool:
    files = _data_files(folder)
    return bool(files) and all(f.suffix.lower() in PARQUET_SUFFIXES for f in files)


#: The first bytes of the compressed formats a data file is often shipped in.
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"(\xb5/\xfd": "zstd", b"PK\x03\x04": "zip"}


def compression(path: Path) -> str | None:
    """The compression a file's first bytes say it is in (gzip, bzip2, xz, zstd, zip), else None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(6)
    except OSError:
        return None
    return next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)


def find_dataset(path: str | os.PathLike[str], field_name: str = "data") -> Path:
    """Resolve a dataset input to one CSV/Parquet file or one directory of Parquet files.

    An artifact directory (it holds ``trainpipe.json``) holds exactly one data file or one
    directory of Parquet files; another directory is a dataset when it holds one data file, or
    Parquet files only.

    Raises:
        InputError: missing path, unsupported format, or an ambiguous directory.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{field_name}: {str(p)!r} does not exist")
    if p.is_file():
        packed = compression(p)
        if packed and p.suffix.lower() != ".parquet":
            raise InputError(
                f"{field_name}: {str(p)!r} is a {packed}-compressed file; trainpipe reads plain .csv and .parquet "
                "files: decompress it first"
            )
        if p.suffix.lower() not in SUPPORTED_SUFFIXES:
            raise InputError(f"{field_name}: {str(p)!r} is not a .csv or .parquet file")
        return p
    files = _data_files(p)
    if (p / MARKER).is_file():
        folders = [d for d in sorted(p.iterdir()) if d.is_dir() and _is_parquet_dir(d)]
        if len(files) + len(folders) != 1:
            raise InputError(
                f"{field_name}: artifact {str(p)!r} must hold exactly one dataset (a .csv/.parquet file or a folder of "
                f".parquet files), found {len(files) + len(folders)}"
            )
        return files[0] if files else folders[0]
    if len(files) == 1:
        return files[0]
    if len(files) > 1 and _is_parquet_dir(p):
        return p
    raise InputError(
        f"{field_name}: directory {str(p)!r} must hold one .csv or .parquet file, or .parquet files only; found "
        f"{len(files)} data files"
    )


# Kept for callers that take only a single file (a directory of Parquet files is refused there).
def find_data_file(path: str | os.PathLike[str], field_name: str = "data") -> Path:
    found = find_dataset(path, field_name)
    if found.is_dir():
        raise InputError(f"{field_name}: {str(found)!r} is a directory of Parquet files; this step takes one file")
    return found


def parquet_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files of a dataset directory, in the order their rows are numbered."""
    return [f for f in _data_files(Path(folder)) if f.suffix.lower() in PARQUET_SUFFIXES]


def _parse_error(field_name: str, f: Path, exc: BaseException) -> InputError:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return InputError(f"{field_name}: {str(f)!r} cannot be parsed as {f.suffix.lstrip('.')}: {msg}")


def read_table(
    path: str | os.PathLike[str], field_name: str = "data", columns: list[str] | None = None
) -> pd.DataFrame:
    """Read a whole dataset (a file, or every file of a Parquet directory) into memory.

    Raises:
        InputError: the file is missing, empty or not parseable, named by path.
    """
    import pandas as pd

    f = find_dataset(path, field_name)
    try:
        if f.is_dir():
            frames = []
            for part in parquet_files(f):
                try:
                    frames.append(pd.read_parquet(part, columns=columns))
                except Exception as exc:
                    raise _parse_error(field_name, part, exc) from None
            df = pd.concat(frames, ignore_index=True)
        elif f.suffix.lower() == ".csv":
            df = pd.read_csv(f, usecols=columns)
        else:
            df = pd.read_parquet(f, columns=columns)
    except InputError:
        raise
    except pd.errors.EmptyDataError:
        raise InputError(f"{field_name}: {str(f)!r} is empty") from None
    except Exception as exc:  # pandas/pyarrow raise many kinds for malformed files
        raise _parse_error(field_name, f, exc) from None
    if df.shape[0] == 0:
        raise InputError(f"{field_name}: {str(f)!r} has no rows")
    return df


def dataset_columns(path: str | os.PathLike[str], field_name: str = "data") -> list[str]:
    """The column names of a dataset (a Parquet directory's first file sets them)."""
    f = find_dataset(path, field_name)
    if f.is_dir() or f.suffix.lower() in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        first = parquet_files(f)[0] if f.is_dir() else f
        try:
            return [str(n) for n in pq.read_schema(first).names if not str(n).startswith("__index_level_")]
        except Exception as exc:
            raise _parse_error(field_name, first, exc) from None
    return [str(c) for c in read_table(f, field_name).columns]


@dataclass(frozen=True)
class RowGroup:
    """One row group of a Parquet dataset: the unit that is read, sharded and shuffled."""

    file: Path
    index: int
    rows: int
    first_row: int  # the dataset-wide number of its first row


def row_groups(path: str | os.PathLike[str], field_name: str = "data") -> list[RowGroup]:
    """Every row group of a Parquet dataset (a file or a directory), from the files' footers only.

    Raises:
        InputError: a file is not Parquet, or the files' columns differ.
    """
    import pyarrow.parquet as pq

    f = find_dataset(path, field_name)
    files = parquet_files(f) if f.is_dir() else [f]
    out: list[RowGroup] = []
    first = 0
    schema = None
    for part in files:
        try:
            meta = pq.ParquetFile(part).metadata
        except Exception as exc:
            raise _parse_error(field_name, part, exc) from None
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        if schema is None:
            schema = names
        elif names != schema:
            raise InputError(
                f"{field_name}: {part.name} has columns {names[:6]} but {files[0].name} has {schema[:6]}: every part "
                "must share one schema"
            )
        for i in range(meta.num_row_groups):
            n = meta.row_group(i).num_rows
            out.append(RowGroup(part, i, n, first))
            first += n
    if first == 0:
        raise InputError(f"{field_name}: {str(f)!r} has no rows")
    return out


def read_row_group(group: RowGroup, columns: list[str]) -> pd.DataFrame:
    """One row group's ``columns`` as a DataFrame."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(group.file).read_row_group(group.index, columns=columns).to_pandas()
    except Exception as exc:
        raise _parse_error("data", group.file, exc) from None


def iter_chunks(
    path: str | os.PathLike[str], columns: list[str] | None = None, field_name: str = "data"
) -> Iterator[tuple[int, pd.DataFrame]]:
    """``(first row number, frame)`` per chunk: row groups of Parquet data, the whole table of a CSV."""
    f = find_dataset(path, field_name)
    if f.suffix.lower() == ".csv" and f.is_file():
        yield 0, read_table(f, field_name, columns)
        return
    for group in row_groups(f, field_name):
        yield group.first_row, read_row_group(group, columns or dataset_columns(f, field_name))


# --- the held-out split ---------------------------------------------------------------------------

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def held_out(rows: Any, test_fraction: float, seed: int) -> Any:
    """Whether each row (by its dataset-wide number) is held out for evaluation.

    A row's fate depends on its number and the seed only (a splitmix64 hash), never on how the
    data is chunked: train_model, evaluate_model and a streaming reader of any row group agree.

    Args:
        rows: Row numbers (an int array).
        test_fraction: The share held out, in (0, 1).
        seed: The split's seed.

    Returns:
        A bool array: True for held-out rows.
    """
    import numpy as np

    if not 0.0 < test_fraction < 1.0:
        raise InputError(f"test_fraction: must be between 0 and 1, got {test_fraction}")
    z = np.asarray(rows, dtype=np.uint64) + np.uint64((seed * _GOLDEN + _GOLDEN) & _MASK64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) < test_fraction


def split_indices(n_rows: int, test_fraction: float, seed: int) -> tuple[Any, Any]:
    """``(train_idx, test_idx)`` of ``n_rows`` rows, sorted, by :func:`held_out`.

    Raises:
        InputError: the split leaves no training or no held-out rows.
    """
    import numpy as np

    mask = held_out(np.arange(n_rows), test_fraction, seed)
    test = np.flatnonzero(mask)
    train = np.flatnonzero(~mask)
    if len(test) == 0 or len(train) == 0:
        raise InputError(
            f"data: {n_rows} rows leave {len(train)} training and {len(test)} held-out rows with test_fraction "
            f"{test_fraction}"
        )
    return train, test


def min_rows(batch_size: int, test_fraction: float, seed: int) -> int:
    """The fewest rows that give at least ``batch_size`` training rows and one held-out row."""
    import numpy as np

    start, train, test = 0, 0, 0
    chunk = max(1024, 2 * batch_size)
    while True:
        mask = held_out(np.arange(start, start + chunk), test_fraction, seed)
        train_cum = train + np.cumsum(~mask)
        test_cum = test + np.cumsum(mask)
        ok = np.flatnonzero((train_cum >= batch_size) & (test_cum >= 1))
        if len(ok):
            return int(start + ok[0] + 1)
        train, test, start = int(train_cum[-1]), int(test_cum[-1]), start + chunk


# --- labels -----------------------------------------------------------------------------------------


def encode_labels(y_raw: Any, classes: list[Any] | None = None) -> tuple[list[Any], Any]:
    """Map raw labels to class indices.

    Args:
        y_raw: The label values.
        classes: The known classes (a trained model's); None learns them from ``y_raw``, sorted.

    Returns:
        ``(classes, indices)``; classes are plain Python values (JSON-able).

    Raises:
        InputError: a label is not one of the known classes.
    """
    import numpy as np

    labels = [plain(v) for v in y_raw]
    if classes is None:
        classes = sorted(set(labels), key=lambda v: (str(type(v)), v))
    index = {c: i for i, c in enumerate(classes)}
    unseen = sorted({str(v) for v in labels if v not in index})
    if unseen:
        raise InputError(f"data: labels the model never saw: {', '.join(unseen[:5])}")
    return classes, np.asarray([index[v] for v in labels], dtype=np.int64)
