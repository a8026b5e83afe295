"""The two sides of the split train_model made, read back: the held-out rows evaluate_model scores
and optimize_model measures on, and the training rows optimize_model calibrates and fine-tunes on.
The split is the model's own (its ``split`` in ``model.json``), so every step sees the same rows.
pandas and NumPy are imported inside the functions.
"""

from __future__ import annotations

from typing import Any

from trainpipe.contract.errors import InputError
from trainpipe.data.preconditions import check_frame
from trainpipe.data.tabular import held_out, iter_chunks


def held_out_rows(data: str, model: Any, label_column: str) -> tuple[Any, Any, int]:
    """The held-out rows of a dataset (the rows train_model never saw), chunk by chunk for Parquet:
    ``(features, raw labels, rows in the dataset)``.

    Raises:
        InputError: a feature or the label is missing or unusable (naming the column, row and value),
            or no row is held out.
    """
    x, y, _, _, rows = split_rows(data, model, label_column)
    return x, y, rows


def split_rows(data: str, model: Any, label_column: str, training_rows: int = 0) -> tuple[Any, Any, Any, Any, int]:
    """Both sides of the split train_model made (its ``split`` in the model's description), chunk by
    chunk: ``(held-out features, their raw labels, training features, their raw labels, rows)``; the
    training side holds its first ``training_rows`` rows at most (0: none).

    Raises:
        InputError: a feature or the label is missing or unusable (naming the column, row and value),
            or no row is held out.
    """
    import numpy as np

    split = model.meta.get("split") or {}
    frac, seed = float(split.get("test_fraction", 0.2)), int(split.get("seed", 0))
    columns = model.feature_columns + [label_column]
    xs, ys, txs, tys, rows, kept = [], [], [], [], 0, 0
    for first, df in iter_chunks(data, None):
        missing = [c for c in columns if c not in df.columns]
        if missing:
            if label_column in missing:
                check_frame(df, label_column, model.task, model.feature_columns)
            raise InputError(f"data: feature columns missing: {', '.join(map(str, missing[:10]))}")
        df = df[columns]
        df.index = np.arange(first, first + len(df))
        check_frame(df, label_column, model.task, columns)
        keep = held_out(df.index.to_numpy(), frac, seed)
        xs.append(df.loc[keep, model.feature_columns].to_numpy(dtype=np.float32))
        ys.append(df.loc[keep, label_column].to_numpy())
        if kept < training_rows:
            train = df.loc[~keep].iloc[: training_rows - kept]
            txs.append(train[model.feature_columns].to_numpy(dtype=np.float32))
            tys.append(train[label_column].to_numpy())
            kept += len(train)
        rows += len(df)
    x, y = np.concatenate(xs), np.concatenate(ys)
    if len(x) == 0:
        raise InputError(
            f"data: none of its {rows} rows is held out with test_fraction {frac}: too few rows to evaluate"
        )
    tx = np.concatenate(txs) if txs else np.zeros((0, len(model.feature_columns)), dtype=np.float32)
    ty = np.concatenate(tys) if tys else np.zeros((0,), dtype=y.dtype)
    return x, y, tx, ty, rows
