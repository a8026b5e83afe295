"""The training arrays every bare baseline uses: the same held-out split (a per-row splitmix64 hash),
classes and row order as train_model (trainpipe.data.tabular / trainpipe.training.data), written out by
hand with numpy and pandas; and the figures each baseline reports from its step end times."""

import statistics
from itertools import pairwise

import numpy as np
import pandas as pd

_GOLDEN = 0x9E3779B97F4A7C15


def held_out(rows: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    z = rows.astype(np.uint64) + np.uint64((seed * _GOLDEN + _GOLDEN) & ((1 << 64) - 1))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) < test_fraction


def load_raw(path: str, label: str, seed: int, test_fraction: float = 0.2):
    """Training rows as they are (float32 features; class indices): what ctx.data.table() gives."""
    df = pd.read_csv(path)
    y_raw = df.pop(label).to_numpy()
    x = df.to_numpy(dtype=np.float32)
    classes, y = np.unique(y_raw, return_inverse=True)
    keep = ~held_out(np.arange(len(df)), test_fraction, seed)
    return np.ascontiguousarray(x[keep]), y[keep].astype(np.int64), len(classes)


def load(path: str, label: str, seed: int, test_fraction: float = 0.2):
    """Training rows, standardized up front (the built-in nets standardize inside: the same numbers)."""
    x, y, n = load_raw(path, label, seed, test_fraction)
    mean = x.astype(np.float64).mean(axis=0)
    std = np.sqrt(np.maximum((x.astype(np.float64) ** 2).mean(axis=0) - mean**2, 0.0))
    std[std == 0] = 1.0
    return ((x - mean.astype(np.float32)) / std.astype(np.float32)).astype(np.float32), y, n


def shard(n_rows: int, batch: int, seed: int, epoch: int, rank: int, world: int):
    """This rank's slice of each global batch of the epoch."""
    steps = n_rows // batch
    return (
        np.random.default_rng(seed + epoch)
        .permutation(n_rows)[: steps * batch]
        .reshape(steps, world, batch // world)[:, rank, :]
    )


def step_figures(ends: list[float], batch: int) -> dict[str, float]:
    """Samples/s from the end of step 5 to the last step (as trainpipe's figure) and the median step time."""
    return {
        "samples_per_second": batch * (len(ends) - 5) / (ends[-1] - ends[4]),
        "median_step_s": statistics.median(b - a for a, b in pairwise(ends)),
    }
