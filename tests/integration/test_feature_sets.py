"""Training sets from a real Feast feature repository (local provider, Parquet sources, file offline
store, registered by ``feast apply``): point-in-time correct, deterministic, recorded in the lineage,
and bad inputs refused in one line before anything is handed on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import result_of, run_component
from tests.helpers.feast_repo import make_feature_repo
from trainpipe.contract.artifacts import MARKER
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import file_digest

pytestmark = pytest.mark.integration

T0 = "2026-01-01T00:00:00Z"
CUSTOMERS = 12


def _days(n):
    import pandas as pd

    return pd.Timestamp(T0) + pd.to_timedelta(n, unit="D")


HOUR = 3600
#: Three views of one entity, each with its own ttl in seconds (0: none) and its own feature.
VIEWS = {"recent": 6 * HOUR, "daily": 30 * HOUR, "ever": 0}
FEATURE = {"recent": "r", "daily": "d", "ever": "e"}


def _source(view, updates):
    """A view's rows: one per (customer, hour) listed, so a pair listed twice is a duplicate row, equal
    in every column; the value names its customer and hour, so a wrong pick shows. ``daily`` is an
    integer feature, the others floats. (The timestamps are UTC: Feast 0.67's file store fails on a
    view with naive ones when no entity row's key is in it, with or without trainpipe.)"""
    import pandas as pd

    stamps = pd.Series([pd.Timestamp(T0) + pd.Timedelta(hours=h) for _, h in updates], dtype="datetime64[ns, UTC]")
    values = [h * 100 + c for c, h in updates]
    return pd.DataFrame(
        {
            "customer_id": [c for c, _ in updates],
            "event_timestamp": stamps,
            FEATURE[view]: values if view == "daily" else [v + 0.5 for v in values],
        }
    )


@pytest.fixture(scope="module")
def history():
    """Each customer's feature rows: four updates at random days; ``day`` is the update's own day, so a
    value newer than its row shows itself."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(7)
    rows = []
    for c in range(CUSTOMERS):
        for d in sorted(rng.choice(np.arange(10, 100), size=4, replace=False)):
            rows.append({"customer_id": c, "event_timestamp": _days(int(d)), "day": float(d), "visits": int(d) % 7})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def repo(tmp_path_factory, history):
    """The module's one repository (applied once): ``activity`` (service ``training``) and VIEWS (service
    ``views``), whose rows a test writes into their source files first."""
    clash = history[["customer_id", "event_timestamp", "day"]]  # a feature named as one of activity's
    views = {"activity": history, "clash": clash, **{view: _source(view, [(0, 0)]) for view in VIEWS}}
    services = {"training": ["activity"], "views": list(VIEWS)}
    return make_feature_repo(
        tmp_path_factory.mktemp("feast") / "repo", views, key="customer_id", ttls=VIEWS, services=services
    )


def _entity(customers, days, labels=None):
    import pandas as pd

    return pd.DataFrame(
        {
            "customer_id": list(customers),
            "event_timestamp": [_days(d) for d in days],
            "label": list(labels) if labels is not None else [i % 2 for i in range(len(days))],
        }
    )


def _leaks(entity, built) -> list[int]:
    """Rows whose feature value is newer than the row's own timestamp."""
    row_day = (entity["event_timestamp"] - _days(0)).dt.total_seconds() / 86400
    return [i for i, (d, r) in enumerate(zip(built["day"], row_day, strict=True)) if d == d and d > r]


def _write_sources(repo, sources):
    for view, updates in sources.items():
        _source(view, updates).to_parquet(repo / "data" / f"{view}.parquet", index=False)


def _as_of_each_view(entity, sources):
    """What the join means, written independently of Feast, per view: ``merge_asof`` backward by
    customer, ttl as tolerance: each feature's latest value at or before the row's moment within its
    view's ttl, empty when that view has none (whatever the other views have)."""
    import pandas as pd

    def utc(stamps):
        return pd.to_datetime(stamps, utc=True).astype("datetime64[ns, UTC]")

    left = entity.assign(at=utc(entity["event_timestamp"])).reset_index()[["index", "customer_id", "at"]]
    left = left.sort_values("at", kind="stable")
    expected = pd.DataFrame(index=entity.index)
    for view, ttl in VIEWS.items():
        right = _source(view, sources[view])
        right = right.assign(at=utc(right["event_timestamp"])).drop(columns="event_timestamp").sort_values("at")
        tolerance = pd.Timedelta(seconds=ttl) if ttl else None
        joined = pd.merge_asof(left, right, on="at", by="customer_id", direction="backward", tolerance=tolerance)
        expected[FEATURE[view]] = joined.set_index("index")[FEATURE[view]].sort_index()
    return expected


_updates = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 72)), min_size=1, max_size=10)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sources=st.fixed_dictionaries(dict.fromkeys(VIEWS, _updates)),
    rows=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 160)), min_size=1, max_size=30),
    zone=st.sampled_from(["UTC", "Asia/Kolkata", "America/New_York"]),
    suffix=st.sampled_from([".parquet", ".csv"]),
)
@example(  # the shape: a value in one view and none yet in another; a ttl's edge; equal rows
    sources={"recent": [(0, 10), (0, 10)], "daily": [(0, 20), (1, 0)], "ever": [(1, 5)]},
    rows=[(0, 24), (0, 32), (0, 34), (0, 40), (0, 40), (1, 10), (6, 40)],
    zone="Asia/Kolkata",
    suffix=".csv",
)
def test_each_feature_gets_its_views_value_as_of_the_rows_moment_within_its_ttl(
    tmp_path, repo, sources, rows, zone, suffix
):
    """Generated views (any customers covered or not, updates at any hour, duplicate rows, each view its
    own ttl) and entity tables (any customers, any half hour, equal rows, timestamps in any time zone, CSV
    or Parquet): every cell is what a per-view ``merge_asof`` gives, rows in the entity table's order.
    (Feast's file store alone drops equal rows, and a row that any view has no value for yet: trainpipe
    keeps every row and each view's own values.)"""
    import numpy as np
    import pandas as pd

    from trainpipe.data.feature_sets import build_training_set

    _write_sources(repo, sources)
    stamps = pd.Series([pd.Timestamp(T0) + pd.Timedelta(minutes=30 * m) for _, m in rows])
    entity = pd.DataFrame(
        {
            "customer_id": [c for c, _ in rows],
            "event_timestamp": stamps.dt.tz_convert(zone),
            "label": [i % 2 for i in range(len(rows))],
        }
    )
    path = tmp_path / f"entity{suffix}"
    if suffix == ".csv":
        entity.to_csv(path, index=False)
    else:
        entity.to_parquet(path, index=False)
    built = build_training_set(str(repo), "views", path, "event_timestamp", tmp_path / "set.parquet")
    got = pd.read_parquet(tmp_path / "set.parquet")
    assert built.rows == len(entity) and list(got.columns) == ["label", "r", "d", "e"]
    assert got["label"].tolist() == entity["label"].tolist()
    expected = _as_of_each_view(entity, sources)
    for column in expected.columns:
        have, want = got[column].astype("float64").to_numpy(), expected[column].astype("float64").to_numpy()
        wrong = [
            (int(i), float(have[i]), float(want[i]))
            for i in np.flatnonzero(~((have == want) | (np.isnan(have) & np.isnan(want))))
        ]
        assert not wrong, f"column {column!r}: (row, got, merge_asof) {wrong[:5]} of {len(wrong)}"


def test_missing_values_name_the_feature_view_that_has_none_and_no_other_views_columns(tmp_path, repo):
    """Customers 3 and 7 have no ``daily`` value yet at their rows' moment, and values in the other views:
    only ``daily``'s column is empty there, and validate_data's line names that view and its ttl (run in
    process: the suite's message is what the entrypoint prints)."""
    import pandas as pd

    from trainpipe.components.validate_data.core import validate_data
    from trainpipe.components.validate_data.spec import ValidateDataConfig
    from trainpipe.contract.artifacts import begin_output
    from trainpipe.contract.errors import ValidationFailed

    late = {3, 7}
    _write_sources(
        repo,
        {
            "recent": [(c, 9) for c in range(CUSTOMERS)],
            "daily": [(c, 30 if c in late else 0) for c in range(CUSTOMERS)],
            "ever": [(c, 0) for c in range(CUSTOMERS)],
        },
    )
    entity = tmp_path / "entities.csv"
    rows = 48
    pd.DataFrame(
        {
            "customer_id": [i % CUSTOMERS for i in range(rows)],
            "event_timestamp": [f"{T0[:10]}T10:00:00Z"] * rows,
            "label": [(i // 3) % 2 for i in range(rows)],
        }
    ).to_csv(entity, index=False)
    out = tmp_path / "v"
    begin_output(out)  # as the entrypoint does
    config = ValidateDataConfig(
        data=str(entity), output_dir=str(out), features="views", feature_repo=str(repo), batch_size=8
    )
    with pytest.raises(ValidationFailed) as failed:
        validate_data(config, {})
    says = str(failed.value)
    assert (
        "feature column 'd' has 8 missing values (first at row 3), from feature view 'daily', which has no value "
        "for those rows at or before their moment within its ttl (30 hours)" in says
    ), says
    assert "'r'" not in says and "'e'" not in says and "failed 1 of" in says, says


def test_two_views_with_a_feature_of_one_name_are_refused_before_feast_is_asked(tmp_path, repo):
    """The set's columns are feature names: one name from two views is refused in one line, naming both."""
    from trainpipe.data.feature_sets import build_training_set

    entity = tmp_path / "entities.csv"
    _entity([0], [50]).to_csv(entity, index=False)
    with pytest.raises(InputError, match=r"^features: feature views 'activity' and 'clash' both have a feature 'day'"):
        build_training_set(str(repo), "activity:day,clash:day", entity, "event_timestamp", tmp_path / "set.parquet")
    assert not (tmp_path / "set.parquet").exists()


def test_a_plain_join_leaks_what_the_point_in_time_join_does_not(tmp_path, repo, history):
    """The check above has teeth: joining each row to its customer's latest values (a plain join) puts
    values from after the row's moment into it; the feature store's set has none."""
    import pandas as pd

    from trainpipe.data.feature_sets import build_training_set

    entity = _entity(range(CUSTOMERS), [50] * CUSTOMERS)
    path = tmp_path / "entity.parquet"
    entity.to_parquet(path, index=False)
    latest = history.sort_values("event_timestamp").groupby("customer_id").tail(1)
    plain = entity.merge(latest.drop(columns="event_timestamp"), on="customer_id", how="left")
    assert _leaks(entity, plain), "the data was meant to hold updates after day 50"
    build_training_set(str(repo), "activity:day", path, "event_timestamp", tmp_path / "set.parquet")
    assert not _leaks(entity, pd.read_parquet(tmp_path / "set.parquet"))


@pytest.fixture(scope="module")
def entity_csv(tmp_path_factory):
    """Every row after its customer's first update (no empty feature), labels of both classes."""
    path = tmp_path_factory.mktemp("entity") / "entities.csv"
    customers = [i % CUSTOMERS for i in range(48)]
    days = [100 + (i % 9) for i in range(48)]
    frame = _entity(customers, days, [(i // 3) % 2 for i in range(48)])
    frame.assign(event_timestamp=frame["event_timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")).to_csv(path, index=False)
    return path


def _validate(entity, out, repo, *extra):
    return run_component(
        "validate_data",
        "--data",
        str(entity),
        "--output-dir",
        str(out),
        "--feature-repo",
        str(repo),
        "--batch-size",
        "8",
        *extra,
    )


def test_validate_data_builds_the_set_and_its_lineage_says_which_features_as_of_when(tmp_path, repo, entity_csv):
    """validate_data with features: the joined set is what the suite checks and hands on; the same
    inputs give the same bytes (so the same DVC hash); the lineage names the repository, each view's
    definition fingerprint, the entity table's hash and its timestamps; snapshot_dataset carries it."""
    from feast import FeatureStore

    from trainpipe.data.feature_sets import fingerprint

    first = result_of(_validate(entity_csv, tmp_path / "v1", repo, "--features", "training"))
    again = result_of(_validate(entity_csv, tmp_path / "v2", repo, "--features", "training"))
    assert first["data_file"] == "training_set.parquet" and first["success"]
    assert first["data_md5"] == again["data_md5"] == file_digest(tmp_path / "v1" / "training_set.parquet")
    assert first["rows"] == 48 and first["columns"] == 3
    marker = json.loads((tmp_path / "v1" / MARKER).read_text())
    feats = marker["lineage"]["features"]
    view = FeatureStore(repo_path=str(repo)).get_feature_view("activity")
    assert feats["views"] == {"activity": {"fingerprint": fingerprint(view), "features": ["day", "visits"]}}
    assert feats["service"] == "training" and feats["project"] == "shop" and feats["repo"] == str(repo.resolve())
    assert feats["entity_md5"] == file_digest(entity_csv) and feats["timestamp_column"] == "event_timestamp"
    assert feats["as_of_min"].startswith("2026-04-11") and feats["as_of_max"].startswith("2026-04-19")
    # the raw data is the entity table, its own bytes (the set's are the snapshot's and data_md5)
    assert marker["lineage"]["source"] == {
        "uri": str(entity_csv.resolve()),
        "md5": file_digest(entity_csv),
        "rows": 48,
        "columns": 3,
    }
    assert not list((tmp_path / "v1").glob(".training_set.*")), "the staging folder was left behind"

    snap = result_of(
        run_component(
            "snapshot_dataset",
            "--data",
            str(tmp_path / "v1"),
            "--output-dir",
            str(tmp_path / "s"),
            "--repo-dir",
            str(tmp_path / "dvc"),
            "--remote-url",
            str(tmp_path / "remote"),
        )
    )
    assert snap["md5"] == first["data_md5"]
    assert json.loads((tmp_path / "s" / MARKER).read_text())["lineage"]["features"] == feats


def test_a_changed_view_definition_has_another_fingerprint_and_the_first_one_back(tmp_path, history):
    """The fingerprint is of the definition: the view without one of its features, applied, has another;
    its first definition applied again (Feast records new moments for its source) has the first again."""
    from feast import FeatureStore

    from trainpipe.data.feature_sets import fingerprint

    def applied(frame):
        repo = make_feature_repo(tmp_path / "a", {"activity": frame}, key="customer_id")
        return fingerprint(FeatureStore(repo_path=str(repo)).get_feature_view("activity"))

    first = applied(history)
    changed = applied(history.drop(columns="visits"))
    assert changed != first == applied(history)


@pytest.mark.parametrize(
    ("extra", "entity_change", "message"),
    [
        (
            ["--features", "no_such_service"],
            None,
            "error: features: feature service 'no_such_service' does not exist in project 'shop' "
            "(known: training, views)",
        ),
        (
            ["--features", "activity:day,stale:spend"],
            None,
            "error: features: feature view 'stale' does not exist in project 'shop' "
            "(known: activity, clash, daily, ever, recent)",
        ),
        (
            ["--features", "training", "--entity-timestamp-column", "as_of"],
            None,
            "error: data: the entity table has no timestamp column 'as_of'",
        ),
        (
            ["--features", "training"],
            "drop_key",
            "error: data: the entity table lacks 'customer_id', the join key of feature view 'activity'",
        ),
    ],
    ids=["unknown-service", "unknown-view", "no-timestamp-column", "no-join-key"],
)
def test_bad_feature_inputs_are_one_line_exit_2_and_nothing_is_handed_on(
    tmp_path, repo, entity_csv, extra, entity_change, message
):
    """Each mistake a team makes with a feature store: one line naming the setting, exit 2, no completed
    output, so the next step (snapshot_dataset) refuses it and nothing is snapshotted."""
    import pandas as pd

    entity = entity_csv
    if entity_change == "drop_key":
        entity = tmp_path / "entities.csv"
        pd.read_csv(entity_csv).drop(columns="customer_id").to_csv(entity, index=False)
    out = tmp_path / "v"
    proc = _validate(entity, out, repo, *extra)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and message in lines[0], lines
    assert not (out / MARKER).exists() and not list(out.glob("*.parquet")) and not list(out.glob(".training_set.*"))
    if entity_change == "drop_key":
        snap = run_component(
            "snapshot_dataset",
            "--data",
            str(out),
            "--output-dir",
            str(tmp_path / "s"),
            "--repo-dir",
            str(tmp_path / "dvc"),
            "--remote-url",
            str(tmp_path / "remote"),
        )
        assert snap.returncode == 2 and "not a completed trainpipe artifact" in snap.stderr
        assert not (tmp_path / "remote").exists()


def test_a_folder_that_is_no_feast_repository_and_features_without_one_are_refused(tmp_path, entity_csv):
    """The repository is checked before Feast is asked anything; a pipeline config with features but no
    repository fails where it is loaded."""
    from trainpipe.data.feature_sets import open_store
    from trainpipe.pipelines.config import load_pipeline_config

    with pytest.raises(InputError, match=r"^feature_repo: .* is not a Feast feature repository"):
        open_store(str(tmp_path))
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(f"data: {entity_csv}\nfeatures: training\n")
    with pytest.raises(InputError, match="'feature_repo': features come from a Feast repository"):
        load_pipeline_config(cfg)
    proc = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "run", "--config", str(cfg), "--engine", "kfp-local"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2 and "feature_repo" in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_the_lineage_report_says_which_features_as_of_when():
    from types import SimpleNamespace

    from trainpipe.services.lineage_report import render

    lineage = {
        "features": {
            "repo": "/repo",
            "project": "shop",
            "service": "training",
            "views": {"activity": {"fingerprint": "ab" * 32, "features": ["day", "visits"]}},
            "entity_md5": "0" * 32,
            "timestamp_column": "event_timestamp",
            "as_of_min": "2026-04-11T00:00:00+00:00",
            "as_of_max": "2026-04-19T00:00:00+00:00",
        },
        "source": {"uri": "/e.csv", "md5": "1" * 32},
    }
    text = render("m", SimpleNamespace(version="1", aliases=[]), lineage, None)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  features"))
    assert "Feast project shop service training at /repo, as of 2026-04-11T00:00:00+00:00 .. 2026-04-19" in lines[at]
    assert lines[at + 1] == "    view     activity: day, visits (definition sha256 abababababababab…)"
    assert lines[at + 2].startswith("  raw data   /e.csv")
