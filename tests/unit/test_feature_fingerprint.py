"""A feature view's fingerprint in the lineage, on Feast's own objects built in process (no repository,
no ``feast apply``): it is of the definition, never of the moments Feast records beside it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.unit

definitions = st.fixed_dictionaries(
    {
        "ttl": st.integers(0, 10**8),
        "features": st.lists(st.sampled_from(["spend", "visits", "day", "score"]), min_size=1, unique=True),
        "description": st.text(max_size=8),
        "pushed": st.booleans(),  # a push source: its batch source (and that one's record) nested one level deeper
    }
)
moments = st.lists(
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc)),
    min_size=5,
    max_size=5,
)


def _view(definition, at):
    """The view a team's ``features.py`` declares, with the moments Feast would have recorded when it
    was applied (created, last updated: the view's, its batch source's, its push source's)."""
    from feast import Entity, FeatureView, Field, FileSource, PushSource
    from feast.types import Float64

    batch = FileSource(path="/data/activity.parquet", timestamp_field="event_timestamp")
    source = PushSource(name="activity_push", batch_source=batch) if definition["pushed"] else batch
    view = FeatureView(
        name="activity",
        entities=[Entity(name="customer", join_keys=["customer_id"])],
        ttl=timedelta(seconds=definition["ttl"]),
        schema=[Field(name=f, dtype=Float64) for f in definition["features"]],
        source=source,
        description=definition["description"],
    )
    view.created_timestamp, view.last_updated_timestamp = at[0], at[1]
    batch.created_timestamp, batch.last_updated_timestamp = at[2], at[3]
    source.last_updated_timestamp = at[4]
    return view


@settings(max_examples=30, deadline=None)
@given(first=definitions, second=definitions, at=moments, again=moments)
def test_the_fingerprint_is_the_definition_whenever_it_was_applied(first, second, at, again):
    """The same definition applied at other moments (as re-applying it after a change does) has the same
    fingerprint; another definition has another."""
    pytest.importorskip("feast")  # here, not at collection: every worker collects every module
    from trainpipe.data.feature_sets import fingerprint

    assert fingerprint(_view(first, at)) == fingerprint(_view(first, again))
    assert (fingerprint(_view(first, at)) == fingerprint(_view(second, again))) == (first == second)
