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
    ttls: dict[str, float] | None = None,
    services: dict[str, list[str]] | None = None,
) -> Path:
    """A feature repository whose views are these DataFrames (``key``, ``event_timestamp`` and the
    features; a float column is Float64, an integer one Int64), one entity keyed by ``key`` and a
    feature service ``service`` with every view (or the ``services`` named, each with its views);
    applied. Each view's ttl is ``ttl_days``, or its own in ``ttls`` (seconds; 0: none). A view's
    source is its Parquet file ``data/<view>.parquet``, read when Feast is asked: writing another
    there changes the view's rows, not its definition."""
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
            f"{name} = FeatureView(name={name!r}, entities=[entity], "
            f"ttl=timedelta(seconds={(ttls or {}).get(name, ttl_days * 86400)!r}), "
            f"schema=[{fields}], online=False, "
            f"source=FileSource(path={str(data / (name + '.parquet'))!r}, timestamp_field='event_timestamp'))",
        ]
    for i, (name, members) in enumerate((services or {service: list(views)}).items()):
        lines.append(f"service_{i} = FeatureService(name={name!r}, features=[{', '.join(members)}])")
    (repo / "features.py").write_text("\n".join(lines) + "\n")
    feast_apply(repo)
    return repo
