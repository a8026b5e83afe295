"""Building a training set from a Feast feature store through trainpipe (what validate_data does
before its suite: checks, a point-in-time join that keeps every entity row in order, Parquet,
fingerprints) against ``get_historical_features`` by hand, each in a fresh process."""

from __future__ import annotations

from typing import Any

from bench.common import BASELINES, PY, Bench, alternate, row, sh

ENTITIES = 5_000
UPDATES = 4
ROWS = 50_000
FEATURES = 8


def _store(b: Bench) -> tuple[Any, Any]:
    """A local Feast repository (one view of FEATURES floats, UPDATES per entity) and an entity table of
    ROWS rows at random moments, made once per run."""
    import numpy as np
    import pandas as pd

    from tests.helpers.feast_repo import make_feature_repo

    root = b.work / "feast"
    if (root / "entities.csv").exists():
        return root / "repo", root / "entities.csv"
    rng = np.random.default_rng(0)
    t0 = pd.Timestamp("2026-01-01", tz="UTC")
    keys = np.repeat(np.arange(ENTITIES), UPDATES)
    history = pd.DataFrame(rng.normal(size=(len(keys), FEATURES)), columns=[f"f{i}" for i in range(FEATURES)])
    history = history.assign(
        customer_id=keys, event_timestamp=t0 + pd.to_timedelta(rng.integers(0, 90 * 86400, len(keys)), unit="s")
    )
    repo = make_feature_repo(root / "repo", {"activity": history}, key="customer_id")
    entity = pd.DataFrame(
        {
            "customer_id": rng.integers(0, ENTITIES, ROWS),
            "event_timestamp": t0 + pd.to_timedelta(rng.integers(30 * 86400, 120 * 86400, ROWS), unit="s"),
            "label": rng.integers(0, 2, ROWS),
        }
    )
    entity.to_csv(root / "entities.csv", index=False)
    return repo, root / "entities.csv"


def run(b: Bench) -> list[dict[str, Any]]:
    repo, entities = _store(b)

    def base() -> float:
        return sh(PY, str(BASELINES / "bare_feast.py"), str(repo), "training", str(entities), str(b.work / "bare.pq"))[
            0
        ]

    def ours() -> float:
        code = (
            "import sys; from pathlib import Path; from trainpipe.data.feature_sets import build_training_set; "
            "build_training_set(sys.argv[1], 'training', sys.argv[2], 'event_timestamp', Path(sys.argv[3]))"
        )
        return sh(PY, "-c", code, str(repo), str(entities), str(b.work / "ours.pq"))[0]

    return [
        row(
            f"training set from Feast ({ROWS:,} entity rows × {FEATURES} features, process wall)",
            "get_historical_features by hand",
            "s",
            *alternate(base, ours, b.repeats),
            "≤ +1 s",
            False,
            lambda r, mb, mo: mo - mb <= 1.0,
        )
    ]
