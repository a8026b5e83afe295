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
    return make_feature_repo(tmp_path_factory.mktemp("feast") / "repo", {"activity": history}, key="customer_id")


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


def _as_of(entity, history):
    """What point-in-time correctness means, written independently of Feast: each row's latest
    update at or before its timestamp (NaN before the first)."""
    import pandas as pd

    left = entity.reset_index().sort_values("event_timestamp")
    right = history.sort_values("event_timestamp")
    joined = pd.merge_asof(left, right, on="event_timestamp", by="customer_id", direction="backward")
    return joined.sort_values("index").reset_index(drop=True)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(st.integers(0, CUSTOMERS - 1), st.integers(0, 110) | st.floats(0, 110)), min_size=1, max_size=40
    )
)
@example(rows=[(0, 100), (0, 100), (1, 0.5), (0, 100)])  # equal rows, and one before its customer's first update
def test_each_row_gets_its_features_as_of_its_timestamp_and_never_a_newer_value(tmp_path, repo, history, rows):
    """Generated entity tables (any customers, any moments, equal rows, rows before the first update):
    every row gets the latest value at or before its own timestamp, in the entity table's order. (Feast's
    file store alone drops equal rows and rows with no value yet: trainpipe keeps every row.)"""
    import pandas as pd

    from trainpipe.feature_sets import build_training_set

    entity = _entity([c for c, _ in rows], [d for _, d in rows])
    path = tmp_path / "entity.parquet"
    entity.to_parquet(path, index=False)
    built = build_training_set(str(repo), "training", path, "event_timestamp", tmp_path / "set.parquet")
    got = pd.read_parquet(tmp_path / "set.parquet")
    assert built.rows == len(entity) and list(got.columns) == ["label", "day", "visits"]
    assert not _leaks(entity, got)
    expected = _as_of(entity, history)
    pd.testing.assert_series_equal(got["day"], expected["day"], check_names=False)
    assert got["label"].tolist() == entity["label"].tolist()


def test_a_plain_join_leaks_what_the_point_in_time_join_does_not(tmp_path, repo, history):
    """The check above has teeth: joining each row to its customer's latest values (a plain join) puts
    values from after the row's moment into it; the feature store's set has none."""
    import pandas as pd

    from trainpipe.feature_sets import build_training_set

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

    from trainpipe.feature_sets import fingerprint

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
    assert marker["lineage"]["source"]["uri"] == str(entity_csv.resolve())
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

    from trainpipe.feature_sets import fingerprint

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
            "error: features: feature service 'no_such_service' does not exist in project 'shop' (known: training)",
        ),
        (
            ["--features", "activity:day,stale:spend"],
            None,
            "error: features: feature view 'stale' does not exist in project 'shop' (known: activity)",
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
    from trainpipe.feature_sets import open_store
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

    from trainpipe.lineage_report import render

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
