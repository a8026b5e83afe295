"""Training sets from a Feast feature store: an entity table joined point-in-time to feature views.

The entity table (a CSV or Parquet file: the join keys, an event timestamp per row and the label)
is joined through Feast's ``get_historical_features``, one feature view at a time: each feature gets
its view's latest value at or before the row's own moment, within the view's ttl, never a newer one;
a view with no such value leaves its own features empty and no other view's. The set keeps the
entity table's row order (so the same inputs give the same bytes, and the same DVC hash) and its
columns but the join keys and the timestamp, which stay in the lineage (the entity table's hash).
Every entity row is kept: rows with the same keys and moment get the same features, whatever the
offline store does with them (Feast's file store keeps one of several equal rows, and drops a row
that any view it joins has no value for yet). Any offline store Feast supports works; the embedded
default is Feast's local provider with Parquet sources and a file offline store.

Feast and pandas are imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainpipe.contract.errors import InputError
from trainpipe.contract.text import plain

#: The entity table's row number while Feast joins (its offline stores do not keep row order).
_ROW = "__trainpipe_row"
#: The column Feast reads an entity table's event timestamps from.
_FEAST_TS = "event_timestamp"


@dataclass(frozen=True)
class FeatureSet:
    """What was built: the set's rows and columns, and what the lineage records of it."""

    rows: int
    columns: list[str]
    repo: str
    project: str
    service: str | None
    views: dict[str, dict[str, Any]]
    entity_md5: str
    timestamp_column: str
    as_of_min: str
    as_of_max: str
    #: the entity table's own shape (the raw data the set was joined from)
    entity_rows: int = 0
    entity_columns: int = 0
    #: each view's ttl in seconds (None: no limit), for what a missing value means
    ttls: dict[str, float | None] = field(default_factory=dict)

    def view_of(self, column: str) -> str | None:
        """The feature view a column of the set came from (None: the entity table's own column)."""
        return next((name for name, view in self.views.items() if column in view["features"]), None)

    def why_missing(self, column: str) -> str | None:
        """What a missing value in a feature column means: its view had no value for the row at or
        before the row's moment (within the view's ttl). None for the entity table's own columns."""
        name = self.view_of(column)
        if name is None:
            return None
        ttl = self.ttls.get(name)
        within = f" within its ttl ({_duration(ttl)})" if ttl else ""
        return f"from feature view {name!r}, which has no value for those rows at or before their moment{within}"


def _duration(seconds: float) -> str:
    """A ttl in its largest whole unit (days, hours, minutes or seconds)."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds:g} seconds"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def open_store(repo: str) -> Any:
    """Feast's FeatureStore of a feature repository (a folder holding ``feature_store.yaml``).

    Raises:
        InputError: Feast is not installed, or the folder is not a Feast repository.
    """
    path = Path(repo)
    if not (path / "feature_store.yaml").is_file():
        raise InputError(f"feature_repo: {repo!r} is not a Feast feature repository (it has no feature_store.yaml)")
    try:
        from feast import FeatureStore
    except ImportError:
        raise InputError("features: Feast is not installed (pip install 'trainpipe[feast]')") from None
    try:
        return FeatureStore(repo_path=str(path.resolve()))
    except Exception as exc:  # Feast raises several kinds for a bad feature_store.yaml
        raise InputError(f"feature_repo: {repo!r}: {_first_line(exc)}") from None


def resolve_features(store: Any, features: str) -> tuple[Any, str | None, dict[str, list[str]]]:
    """What to fetch: a feature service by name, or ``view:feature`` references (comma-separated).

    Returns:
        What ``get_historical_features`` takes, the service's name (or None), and the features by view.

    Raises:
        InputError: an unknown feature service, feature view or feature (the known ones named).
    """
    spec = features.strip()
    if ":" not in spec:
        try:
            service = store.get_feature_service(spec)
        except Exception:
            known = sorted(s.name for s in store.list_feature_services())
            raise InputError(
                f"features: feature service {spec!r} does not exist in project {store.project!r} "
                f"(known: {', '.join(known) or 'none'})"
            ) from None
        projected = {p.name: [f.name for f in p.features] for p in service.feature_view_projections}
        return service, spec, projected
    views = {v.name: v for v in _all_views(store)}
    by_view: dict[str, list[str]] = {}
    refs = [r.strip() for r in spec.split(",") if r.strip()]
    for ref in refs:
        view_name, _, feature = ref.partition(":")
        if view_name not in views:
            raise InputError(
                f"features: feature view {view_name!r} does not exist in project {store.project!r} "
                f"(known: {', '.join(sorted(views)) or 'none'})"
            )
        names = [f.name for f in views[view_name].features]
        if feature not in names:
            raise InputError(
                f"features: feature view {view_name!r} has no feature {feature!r} (it has: {', '.join(names)})"
            )
        by_view.setdefault(view_name, []).append(feature)
    if not refs:
        raise InputError("features: name a feature service, or view:feature references separated by commas")
    return refs, None, by_view


def _all_views(store: Any) -> list[Any]:
    return [*store.list_feature_views(), *store.list_on_demand_feature_views()]


def fingerprint(view: Any) -> str:
    """sha256 of a feature view's definition (its spec as Feast stores it: features, entities,
    source, TTL), not of when it was applied: the same definition has the same fingerprint, also
    when it is applied again after a change.

    Feast's protos keep what it records of an object's life (when it was created and last updated,
    the event times it has seen) in a ``meta`` message beside the definition; a view's spec holds
    its data source whole, ``meta`` included, so every such message is left out, at any depth."""
    spec = view.to_proto().spec
    _drop_meta(spec)
    return hashlib.sha256(spec.SerializeToString(deterministic=True)).hexdigest()


def _drop_meta(message: Any) -> None:
    """Clear every ``meta`` field of a Feast type ``…Meta`` in ``message`` and the messages it holds."""
    for desc, value in message.ListFields():
        if desc.message_type is None:
            continue
        if desc.name == "meta" and desc.message_type.name.endswith("Meta"):
            message.ClearField(desc.name)
        elif desc.message_type.GetOptions().map_entry:
            if desc.message_type.fields_by_name["value"].message_type is not None:
                for item in value.values():
                    _drop_meta(item)
        elif hasattr(value, "ListFields"):
            _drop_meta(value)
        else:  # a repeated field of messages
            for item in value:
                _drop_meta(item)


def _join_keys(view: Any) -> list[str]:
    return list(getattr(view, "join_keys", None) or [c.name for c in view.entity_columns])


def _ttl_seconds(view: Any) -> float | None:
    ttl = getattr(view, "ttl", None)  # an on-demand view has none: its sources' apply
    if ttl is None or not ttl.total_seconds():
        return None
    return ttl.total_seconds()


def _entity_table(path: Path, timestamp_column: str) -> Any:
    """The entity table with its timestamps parsed (UTC).

    Raises:
        InputError: the file cannot be read, lacks the timestamp column, or holds a value that is no timestamp.
    """
    import pandas as pd

    from trainpipe.data.tabular import read_table

    df = read_table(path, "data")
    if timestamp_column not in df.columns:
        raise InputError(
            f"data: the entity table has no timestamp column {timestamp_column!r} (entity_timestamp_column; it has: "
            f"{', '.join(map(str, df.columns))})"
        )
    parsed = pd.to_datetime(df[timestamp_column], errors="coerce", utc=True)
    bad = parsed.isna()
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise InputError(
            f"data: column {timestamp_column!r} row {row} holds {plain(df[timestamp_column].iloc[row])!r}, not a "
            "timestamp"
        )
    if _ROW in df.columns:
        raise InputError(f"data: the entity table has a column named {_ROW!r}, which trainpipe uses while it joins")
    return df.assign(**{timestamp_column: parsed})


def build_training_set(
    repo: str, features: str, entity_table: str | Path, timestamp_column: str, dest: Path
) -> FeatureSet:
    """Join the entity table to the features point-in-time and write the set as one Parquet file.

    Raises:
        InputError: a bad repository, feature reference or entity table; a join key missing; two views
            with a feature of the same name; Feast's own complaint about the join, in one line.
    """
    from trainpipe.contract.io import atomic_write_bytes, file_digest

    store = open_store(repo)
    _, service, by_view = resolve_features(store, features)
    source = Path(entity_table)
    entity_md5 = file_digest(source)
    df = _entity_table(source, timestamp_column)
    views = {v.name: v for v in _all_views(store)}
    owner: dict[str, str] = {}
    for name, feats in by_view.items():
        for key in _join_keys(views[name]):
            if key not in df.columns:
                raise InputError(
                    f"data: the entity table lacks {key!r}, the join key of feature view {name!r} (it has: "
                    f"{', '.join(map(str, df.columns))})"
                )
        for feat in feats:
            if owner.setdefault(feat, name) != name:
                raise InputError(
                    f"features: feature views {owner[feat]!r} and {name!r} both have a feature {feat!r}, and the "
                    "set's columns are feature names: name it from one view only"
                )
    moments = {*(k for name in by_view for k in _join_keys(views[name])), timestamp_column}
    kept = [c for c in df.columns if c not in moments]
    clash = sorted(set(kept) & set(owner))
    if clash:
        raise InputError(f"data: the entity table's column {clash[0]!r} has the name of a feature it is joined to")
    # one query per view: Feast's file store drops an entity row that any view it joins has no value
    # for yet, so a view queried beside another could empty this one's values
    columns = [df[kept].reset_index(drop=True)]
    for name, feats in by_view.items():
        columns.append(_join_view(store, df, timestamp_column, _join_keys(views[name]), name, feats))
    out = columns[0].join(columns[1:]) if len(columns) > 1 else columns[0]
    buf = io.BytesIO()
    out.to_parquet(buf, index=False)
    atomic_write_bytes(dest, buf.getvalue())
    stamps = df[timestamp_column]
    return FeatureSet(
        rows=len(out),
        columns=[str(c) for c in out.columns],
        repo=str(Path(repo).resolve()),
        project=str(store.project),
        service=service,
        views={name: {"fingerprint": fingerprint(views[name]), "features": feats} for name, feats in by_view.items()},
        entity_md5=entity_md5,
        timestamp_column=timestamp_column,
        as_of_min=stamps.min().isoformat(),
        as_of_max=stamps.max().isoformat(),
        entity_rows=len(df),
        entity_columns=len(df.columns),
        ttls={name: _ttl_seconds(views[name]) for name in by_view},
    )


def _join_view(store: Any, df: Any, timestamp_column: str, keys: list[str], view: str, feats: list[str]) -> Any:
    """One view's features for every entity row, in the entity table's order: the view's latest value
    at or before the row's moment within its ttl, or empty.

    Feast is asked once per distinct (join keys, moment): its file store keeps one of several equal
    entity rows and drops a row that has no value yet; every row is put back from its moment's answer.

    Raises:
        InputError: Feast's own complaint (a source it cannot read), in one line.
    """
    import pandas as pd

    moment = [*keys, timestamp_column]
    group = df.groupby(moment, sort=False, dropna=False).ngroup().to_numpy()
    first = ~pd.Series(group).duplicated().to_numpy()
    entity = df.loc[first, moment].assign(**{_ROW: group[first]}).rename(columns={timestamp_column: _FEAST_TS})
    try:
        joined = store.get_historical_features(entity_df=entity, features=[f"{view}:{f}" for f in feats]).to_df()
    except Exception as exc:  # Feast's own complaint (a source it cannot read)
        raise InputError(f"features: Feast could not build the training set: {_first_line(exc)}") from None
    by_moment = joined[[_ROW, *feats]].drop_duplicates(_ROW).set_index(_ROW)
    return by_moment.reindex(group).reset_index(drop=True)


__all__ = ["FeatureSet", "build_training_set", "fingerprint", "open_store", "resolve_features"]
