"""A real Feast feature repository for tests: Feast's local provider, one Parquet source per feature
view, a file offline store, registered with the real ``feast apply``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FEATURE_STORE_YAML = """\
project: {project}
provider: local
registry: data/registry.db
online_store:
  type: sqlite
  path: data/online.db
offline_store:
  type: file
entity_key_serialization_version: 3
"""


def feast_apply(repo: Path) -> None:
    """``feast apply`` in the repository, as a feature team's CI runs it."""
    feast = Path(sys.executable).parent / "feast"
    proc = subprocess.run([str(feast), "apply"], cwd=repo, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


def make_feature_repo(
    repo: Path,
    views: dict[str, object],
    key: str,
    service: str = "training",
    project: str = "shop",
    ttl_days: int = 3650,
) -> Path:
    """A feature repository whose views are these DataFrames (``key``, ``event_timestamp`` and the
    features; a float column is Float64, an integer one Int64), one entity keyed by ``key`` and a
    feature service with every view; applied."""
    data = repo / "data"
    data.mkdir(parents=True, exist_ok=True)
    (repo / "feature_store.yaml").write_text(FEATURE_STORE_YAML.format(project=project))
    lines = [
        "from datetime import timedelta",
        "from feast import Entity, FeatureService, FeatureView, Field, FileSource",
        "from feast.types import Float64, Int64",
        "",
        f"entity = Entity(name='entity', join_keys=[{key!r}])",
    ]
    for name, df in views.items():
        df.to_parquet(data / f"{name}.parquet", index=False)  # type: ignore[attr-defined]
        fields = ", ".join(
            f"Field(name={c!r}, dtype={'Int64' if str(df[c].dtype).startswith('int') else 'Float64'})"  # type: ignore[index]
            for c in df.columns  # type: ignore[attr-defined]
            if c not in (key, "event_timestamp")
        )
        lines += [
            f"{name} = FeatureView(name={name!r}, entities=[entity], ttl=timedelta(days={ttl_days}), "
            f"schema=[{fields}], online=False, "
            f"source=FileSource(path={str(data / (name + '.parquet'))!r}, timestamp_field='event_timestamp'))",
        ]
    lines.append(f"{service} = FeatureService(name={service!r}, features=[{', '.join(views)}])")
    (repo / "features.py").write_text("\n".join(lines) + "\n")
    feast_apply(repo)
    return repo
