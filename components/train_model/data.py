"""Training data for every backend: read the snapshot, split, scale, and shard global batches.

numpy and pandas only, so the torch, TensorFlow and Horovod workers share it and the
launcher can run it once, before any rank starts, to fail fast on bad data.
"""

from __future__ import annotations

import math
from typing import Any

from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.contract.errors import InputError


def prepare_data(config: TrainModelConfig) -> dict[str, Any]:
    """Read the snapshot and build the training arrays (the same on every rank).

    Returns:
        ``x`` (scaled train features, float32), ``y`` (class indices, int64), and the
        metadata model.json records: feature columns, classes, mean, std, input shape.

    Raises:
        InputError: unreadable data, a missing or single-class label, or features that
            do not fit the requested image shape.
    """
    import numpy as np

    from trainpipe.tabular import encode_labels, features_and_label, read_table, split_indices

    df = read_table(config.data, "data")
    cols, x, y_raw = features_and_label(df, config.label_column)
    classes, y = encode_labels(y_raw)
    if len(classes) < 2:
        raise InputError(f"label_column: {config.label_column!r} has a single class; nothing to learn")
    train_idx, _ = split_indices(len(df), config.test_fraction, config.seed)
    if len(train_idx) < config.batch_size:
        raise InputError(f"batch_size: {config.batch_size} is larger than the {len(train_idx)} training rows")
    xt = x[train_idx]
    mean = xt.mean(axis=0)
    std = xt.std(axis=0)
    std[std == 0] = 1.0
    return {
        "x": ((xt - mean) / std).astype(np.float32),
        "y": np.asarray(y[train_idx], dtype=np.int64),
        "feature_columns": cols,
        "classes": classes,
        "mean": mean.tolist(),
        "std": std.tolist(),
        "n_train": int(len(train_idx)),
        "input_shape": input_shape(config, len(cols)),
    }


def input_shape(config: TrainModelConfig, n_features: int) -> list[int]:
    """The shape a model sees per row: ``[features]`` for mlp, ``[C, H, W]`` for cnn."""
    if config.model != "cnn" and config.image_shape is None:
        return [n_features]
    shape = list(config.image_shape) if config.image_shape else None
    if shape is None:
        side = math.isqrt(n_features)
        if side * side != n_features:
            raise InputError(
                f"image_shape: {n_features} feature columns are not a square image; set image_shape for model cnn"
            )
        shape = [side, side]
    if len(shape) == 2:
        shape = [1, *shape]
    if math.prod(shape) != n_features:
        raise InputError(f"image_shape: {shape} holds {math.prod(shape)} values but the data has {n_features} feature columns")
    return shape


def steps_per_epoch(n_rows: int, batch_size: int) -> int:
    """Full global batches per epoch; the remainder is dropped so every rank's share is equal."""
    return n_rows // batch_size


def epoch_permutation(n_rows: int, seed: int, epoch: int) -> Any:
    """The global order of rows in an epoch: seeded by ``seed + epoch`` (as DistributedSampler does)."""
    import numpy as np

    return np.random.default_rng(seed + epoch).permutation(n_rows)


def rank_batches(n_rows: int, batch_size: int, seed: int, epoch: int, rank: int, world: int, start_step: int = 0) -> Any:
    """Row indices of this rank's share of each global batch, from ``start_step`` on.

    Global batch k is rows ``perm[k*B:(k+1)*B]``; rank r takes the r-th contiguous
    slice of B/world. Together the ranks see exactly the batch a single process with
    batch B sees, so a world of any size follows the same trajectory (up to
    floating-point summation order). ``start_step`` resumes an epoch mid-way.

    Returns:
        An int64 array of shape ``(steps, B/world)``.
    """
    steps = steps_per_epoch(n_rows, batch_size)
    local = batch_size // world
    perm = epoch_permutation(n_rows, seed, epoch)[: steps * batch_size].reshape(steps, world, local)
    return perm[start_step:, rank, :]
