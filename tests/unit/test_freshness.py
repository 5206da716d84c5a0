"""Freshness for `slicewise status`: pure functions, no Kafka."""

from datetime import datetime, timedelta, timezone

from slicewise.freshness import Published, freshness
from slicewise.slices import Boundary

T0 = datetime(2026, 11, 25, 10, tzinfo=timezone.utc)


def test_lag_is_measured_from_the_newest_boundary_and_age_from_the_newest_published_slice():
    boundaries = [
        Boundary("events", T0 + timedelta(hours=2), {0: 40, 1: 7}),
        Boundary("events", T0, {0: 10, 1: 3}),
    ]
    published = [
        Published("a", T0 + timedelta(hours=1), T0 + timedelta(hours=1, minutes=5)),
        Published("b", T0 + timedelta(hours=2), T0 + timedelta(hours=2, minutes=4)),
    ]
    # A partition that appeared after the newest boundary counts from offset 0.
    fresh = freshness(boundaries, {0: 52, 1: 7, 2: 5}, published)
    assert fresh.newest_boundary == T0 + timedelta(hours=2)
    assert fresh.behind == {0: 12, 1: 0, 2: 5}
    assert fresh.published.slice_id == "b"
    now = T0 + timedelta(hours=4, minutes=30)
    lag, age = fresh.describe(now)
    assert "(2 h 30 min ago); offsets behind the LSO: p0 12, p1 0, p2 5" in lag
    assert "newest published slice b: data up to 2 h 30 min ago, published 2 h 26 min ago" in age
    assert fresh.to_json()["behind_last_stable"] == {"0": 12, "1": 0, "2": 5}


def test_without_kafka_or_slices_it_says_what_it_does_not_know():
    fresh = freshness([Boundary("events", T0, {0: 1})], None, [])
    lag, age = fresh.describe(T0 + timedelta(minutes=3))
    assert "3 min ago" in lag and "unknown (Kafka did not answer)" in lag
    assert age == "FRESHNESS no slice published yet"
    assert freshness([], {0: 4}, []).describe(T0) == ["FRESHNESS no boundary frozen yet"]
