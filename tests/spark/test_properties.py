"""Property-based tests (hypothesis) of the parser and the in-slice dedup, on real Spark.

Each example is a whole batch of records, so a few dozen Spark jobs cover
hundreds of generated records.
"""

from __future__ import annotations

import json
import random
import re
from datetime import datetime, timezone

from builders import bronze_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from slicewise.contract import parse_events, reasons
from slicewise.pipelines import load_pipelines
from slicewise.transforms import dedup_within, quarantined, valid_events

MAX_VALUE_BYTES = 512
TS = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
EVENTS = load_pipelines()["events"]  # the example definition: the demo's contract
BATCHES = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Unicode's White_Space property, listed: what the contract calls blank is made of these.
WHITESPACE_CHARS = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000")
)
WHITESPACE = re.compile(f"[{re.escape(WHITESPACE_CHARS)}]*")
json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
non_blank = st.text(min_size=1, max_size=16).filter(lambda s: not WHITESPACE.fullmatch(s))
# Within the default event-time bound (ten years) of the records' Kafka timestamp, TS.
instants = st.datetimes(
    min_value=datetime(2017, 1, 1), max_value=datetime(2036, 6, 30), timezones=st.just(timezone.utc)
)
valid_docs = st.fixed_dictionaries(
    {
        "event_id": non_blank,
        "event_type": non_blank,
        "occurred_at": instants.map(lambda t: t.isoformat(timespec="seconds")),
    },
    optional={"payload": st.dictionaries(st.text(max_size=8), json_values, max_size=3)},
)
# Each defect, and the reason the contract gives it.
defects = st.sampled_from(
    [
        (lambda d: {k: v for k, v in d.items() if k != "event_id"}, "missing:event_id"),
        (lambda d: {**d, "event_id": 42}, "wrong_type:event_id"),
        (lambda d: {**d, "event_id": "   "}, "blank:event_id"),
        (lambda d: {**d, "event_type": ""}, "blank:event_type"),
        (lambda d: {k: v for k, v in d.items() if k != "occurred_at"}, "missing:occurred_at"),
        (
            lambda d: {**d, "occurred_at": "2026-11-01T10:15:00"},
            "unparseable_time:occurred_at",
        ),  # no zone
        (lambda d: {**d, "payload": [1, 2]}, "wrong_type:payload"),
    ]
)


@st.composite
def records(draw) -> tuple[bytes, str | None, str | None]:
    """(value, expected reason or None if unknown, expected event_id if valid)."""
    kind = draw(st.sampled_from(["valid", "defect", "blank", "json", "bytes"]))
    if kind == "valid":
        doc = draw(valid_docs)
        return json.dumps(doc).encode(), "valid", doc["event_id"]
    if kind == "blank":  # an id or type of nothing but whitespace, of any kind
        doc, field = draw(valid_docs), draw(st.sampled_from(["event_id", "event_type"]))
        doc[field] = draw(st.text(alphabet=WHITESPACE_CHARS, max_size=4))
        reason = f"blank:{field}"
        return json.dumps(doc).encode(), reason, None
    if kind == "defect":
        doc, (mutate, reason) = draw(valid_docs), draw(defects)
        return json.dumps(mutate(doc)).encode(), reason, None
    if kind == "json":
        return json.dumps(draw(json_values)).encode(), None, None
    return draw(st.binary(max_size=MAX_VALUE_BYTES + 64)), None, None


@BATCHES
@given(batch=st.lists(records(), min_size=1, max_size=40))
def test_every_record_is_a_valid_event_or_quarantined_with_a_reason(spark, batch):
    parsed = parse_events(
        bronze_rows(spark, [(0, i, v) for i, (v, _, _) in enumerate(batch)]),
        EVENTS,
        MAX_VALUE_BYTES,
    )
    good = {r.kafka_offset: r for r in valid_events(parsed, EVENTS).collect()}
    bad = {r.offset: r.reason for r in quarantined(parsed).collect()}

    assert not good.keys() & bad.keys()  # never both
    assert good.keys() | bad.keys() == set(range(len(batch)))  # nothing lost
    assert set(bad.values()) <= set(reasons(EVENTS))
    for offset, row in good.items():  # what passes really meets the contract
        doc = json.loads(batch[offset][0])
        assert isinstance(doc["event_id"], str) and not WHITESPACE.fullmatch(doc["event_id"])
        assert isinstance(doc["event_type"], str) and not WHITESPACE.fullmatch(doc["event_type"])
        assert row.event_id == doc["event_id"] and row.occurred_at is not None
    for offset, (value, expected, event_id) in enumerate(batch):
        if len(value) > MAX_VALUE_BYTES:
            assert bad[offset] == "oversized_value"
        elif expected == "valid":
            assert good[offset].event_id == event_id, bad.get(offset)
        elif expected is not None:
            assert bad.get(offset) == expected, (value, good.get(offset))


ids = st.sampled_from([f"e{i}" for i in range(6)])
positions = st.tuples(st.integers(0, 3), st.integers(0, 500))


@BATCHES
@given(
    batch=st.lists(st.tuples(positions, ids), min_size=1, max_size=40, unique_by=lambda r: r[0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_dedup_keeps_the_lowest_position_is_idempotent_and_order_independent(spark, batch, seed):
    def events(rows):
        values = [
            (
                p,
                o,
                json.dumps(
                    {"event_id": e, "event_type": "t", "occurred_at": "2026-11-01T10:00:00Z"}
                ).encode(),
            )
            for (p, o), e in rows
        ]
        return valid_events(
            parse_events(bronze_rows(spark, values), EVENTS, MAX_VALUE_BYTES), EVENTS
        )

    once = dedup_within(events(batch), EVENTS)
    survivors = {r.event_id: (r.kafka_partition, r.kafka_offset) for r in once.collect()}
    expected: dict[str, tuple[int, int]] = {}
    for position, event_id in batch:
        expected[event_id] = min(expected.get(event_id, position), position)
    assert survivors == expected
    assertDataFrameEqual(dedup_within(once, EVENTS), once)
    shuffled = list(batch)
    random.Random(seed).shuffle(shuffled)
    assertDataFrameEqual(dedup_within(events(shuffled), EVENTS), once)
    assert once.groupBy("event_id").count().where(F.col("count") > 1).count() == 0
