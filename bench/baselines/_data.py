"""The training arrays every bare baseline uses: the same held-out split, scaling and row order
as train_model (trainpipe.tabular / data.rank_batches), written out by hand, with numpy and pandas;
and the figures each baseline reports from its step end times."""

import statistics

import numpy as np
import pandas as pd


def load(path: str, label: str, seed: int, test_fraction: float = 0.2):
    df = pd.read_csv(path)
    y_raw = df.pop(label).to_numpy()
    x = df.to_numpy(dtype=np.float32)
    classes, y = np.unique(y_raw, return_inverse=True)
    n = len(df)
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(n * test_fraction)))
    train_idx = np.sort(perm[n_test:])
    xt = x[train_idx]
    mean, std = xt.mean(axis=0), xt.std(axis=0)
    std[std == 0] = 1.0
    return ((xt - mean) / std).astype(np.float32), y[train_idx].astype(np.int64), len(classes)


def shard(n_rows: int, batch: int, seed: int, epoch: int, rank: int, world: int):
    """This rank's slice of each global batch of the epoch."""
    steps = n_rows // batch
    return np.random.default_rng(seed + epoch).permutation(n_rows)[: steps * batch].reshape(steps, world, batch // world)[:, rank, :]


def step_figures(ends: list[float], batch: int) -> dict[str, float]:
    """Samples/s from the end of step 5 to the last step (as trainpipe's figure) and the median step time."""
    return {"samples_per_second": batch * (len(ends) - 5) / (ends[-1] - ends[4]),
            "median_step_s": statistics.median(b - a for a, b in zip(ends, ends[1:]))}
