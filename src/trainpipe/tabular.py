"""Tabular data helpers shared by the components that read a dataset.

pandas is imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.contract.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

SUPPORTED_SUFFIXES = (".csv", ".parquet", ".pq")


def find_data_file(path: str | os.PathLike[str], field_name: str = "data") -> Path:
    """Resolve a dataset input to one CSV or Parquet file.

    A directory (an artifact) must hold exactly one data file.

    Raises:
        InputError: missing path, unsupported format, or an ambiguous directory.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{field_name}: {str(p)!r} does not exist")
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in SUPPORTED_SUFFIXES)
        if len(files) != 1:
            raise InputError(f"{field_name}: directory {str(p)!r} must hold exactly one .csv or .parquet file, found {len(files)}")
        return files[0]
    if p.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise InputError(f"{field_name}: {str(p)!r} is not a .csv or .parquet file")
    return p


def read_table(path: str | os.PathLike[str], field_name: str = "data") -> "pd.DataFrame":
    """Read a CSV or Parquet file (or a one-file artifact directory).

    Raises:
        InputError: the file is missing, empty or not parseable, named by path.
    """
    import pandas as pd

    f = find_data_file(path, field_name)
    try:
        if f.suffix.lower() == ".csv":
            df = pd.read_csv(f)
        else:
            df = pd.read_parquet(f)
    except pd.errors.EmptyDataError:
        raise InputError(f"{field_name}: {str(f)!r} is empty") from None
    except Exception as exc:  # pandas/pyarrow raise many kinds for malformed files
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{field_name}: {str(f)!r} cannot be parsed as {f.suffix.lstrip('.')}: {msg}") from None
    if df.shape[0] == 0:
        raise InputError(f"{field_name}: {str(f)!r} has no rows")
    return df


def split_indices(n_rows: int, test_fraction: float, seed: int) -> tuple[Any, Any]:
    """The deterministic train/held-out split every component agrees on.

    The same ``(n_rows, test_fraction, seed)`` always gives the same split, so
    evaluate_model scores exactly the rows train_model never saw.

    Returns:
        ``(train_idx, test_idx)`` as sorted numpy arrays.
    """
    import numpy as np

    if not 0.0 < test_fraction < 1.0:
        raise InputError(f"test_fraction: must be between 0 and 1, got {test_fraction}")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_rows)
    n_test = max(1, int(round(n_rows * test_fraction)))
    if n_test >= n_rows:
        raise InputError(f"test_fraction: leaves no training rows out of {n_rows}")
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def features_and_label(df: "pd.DataFrame", label_column: str, feature_columns: list[str] | None = None) -> tuple[list[str], Any, Any]:
    """Split a frame into numeric features and the label column.

    Raises:
        InputError: the label or a feature column is missing, or a feature is not numeric.
    """
    import numpy as np

    if label_column not in df.columns:
        raise InputError(f"label_column: {label_column!r} is not a column of the data (columns: {', '.join(map(str, df.columns[:10]))}{'…' if len(df.columns) > 10 else ''})")
    cols = feature_columns if feature_columns is not None else [c for c in df.columns if c != label_column]
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise InputError(f"data: feature columns missing: {', '.join(map(str, missing))}")
    if not cols:
        raise InputError("data: no feature columns besides the label")
    feats = df[cols]
    import pandas as pd

    # pandas' own test: extension dtypes (pandas 3's str columns) are not numpy dtypes
    non_numeric = [c for c in cols if not pd.api.types.is_numeric_dtype(feats[c]) or pd.api.types.is_bool_dtype(feats[c])]
    if non_numeric:
        raise InputError(f"data: feature columns must be numeric; not numeric: {', '.join(map(str, non_numeric[:5]))}")
    x = feats.to_numpy(dtype=np.float32)
    if not np.isfinite(x).all():
        raise InputError("data: feature columns contain NaN or infinite values")
    y = df[label_column]
    if y.isna().any():
        raise InputError(f"label_column: {label_column!r} has {int(y.isna().sum())} missing values")
    return [str(c) for c in cols], x, y.to_numpy()


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

    labels = [v.item() if hasattr(v, "item") else v for v in y_raw]
    if classes is None:
        classes = sorted(set(labels), key=lambda v: (str(type(v)), v))
    index = {c: i for i, c in enumerate(classes)}
    unseen = sorted({str(v) for v in labels if v not in index})
    if unseen:
        raise InputError(f"data: labels the model never saw: {', '.join(unseen[:5])}")
    return classes, np.asarray([index[v] for v in labels], dtype=np.int64)
