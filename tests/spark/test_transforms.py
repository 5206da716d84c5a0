"""Bronze -> silver/quarantine transforms, asserted as whole DataFrames."""

import json
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from builders import bronze_rows
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from slicewise.contract import parse_events, reasons
from slicewise.pipelines import (
    FieldSpec,
    PipelineDefinitionError,
    PipelinesFile,
    Survivor,
    load_pipelines,
)
from slicewise.transforms import (
    dedup_within,
    duplicated,
    event_date_span,
    events_per_hour,
    horizon_ranges,
    kept_once,
    quarantined,
    slice_ids,
    survivors,
    valid_events,
    window_hours,
)

TS = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
REPO = Path(__file__).resolve().parents[2]
EVENTS = load_pipelines()["events"]  # the example definition: the demo's contract


def event(event_id, **overrides):
    doc = {
        "event_id": event_id,
        "event_type": "click",
        "occurred_at": "2026-11-01T10:15:00Z",
        "payload": {"n": 1},
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


MALFORMED = [
    (None, "null_value"),
    (b"x" * 600, "oversized_value"),
    (b"\xff\xfe{}", "invalid_utf8"),
    (b"{not json", "invalid_json"),
    (b"[1, 2]", "not_an_object"),
    (b' \n\t[{"event_id": "e-1"}]', "not_an_object"),  # JSON may open with whitespace
    (b'"just a string"', "not_an_object"),
    (b"null", "not_an_object"),
    (
        json.dumps({"event_type": "click", "occurred_at": "2026-11-01T10:15:00Z"}).encode(),
        "missing:event_id",
    ),
    (event(None), "missing:event_id"),
    (event(42), "wrong_type:event_id"),
    (event("   "), "blank:event_id"),
    (event("\t\u3000"), "blank:event_id"),  # any Unicode whitespace, not only spaces
    (event("e-9", event_type="\n"), "blank:event_type"),
    (event("e-9", event_type=7), "wrong_type:event_type"),
    (event("e-9", occurred_at=None), "missing:occurred_at"),
    (event("e-9", occurred_at="2026-11-01 10:15"), "unparseable_time:occurred_at"),
    (event("e-9", occurred_at="2026-11-01T10:15:00"), "unparseable_time:occurred_at"),  # no zone
    (event("e-9", payload=[1]), "wrong_type:payload"),
    (event("e-9", payload="{}"), "wrong_type:payload"),  # a string that looks like one
    (event("e-9", payload=3), "wrong_type:payload"),
]


@pytest.mark.parametrize(("value", "reason"), MALFORMED, ids=[r for _, r in MALFORMED])
def test_each_malformed_kind_gets_its_reason(spark, value, reason):
    parsed = parse_events(bronze_rows(spark, [(0, 7, value)]), EVENTS, 512)
    got = quarantined(parsed).select("partition", "offset", "value", "reason", "slice_id")
    expected = spark.createDataFrame([(0, 7, value, reason, "s1")], got.schema)
    assertDataFrameEqual(got, expected)
    assert valid_events(parsed, EVENTS).count() == 0


def test_valid_event_parses_to_silver_columns(spark):
    value = event("e-1", occurred_at="2026-11-01T23:30:00.250+02:00", extra_field="ignored")
    got = valid_events(parse_events(bronze_rows(spark, [(1, 3, value)]), EVENTS, 1024), EVENTS)
    expected = spark.createDataFrame(
        [
            (
                "e-1",
                "click",
                datetime(2026, 11, 1, 21, 30, 0, 250000, tzinfo=timezone.utc),
                '{"n":1}',
                date(2026, 11, 1),
                1,
                3,
                TS,
                "s1",
            )
        ],
        got.schema,
    )
    assertDataFrameEqual(got, expected)
    assert quarantined(parse_events(bronze_rows(spark, [(1, 3, value)]), EVENTS, 1024)).count() == 0


def test_an_object_after_whitespace_and_an_absent_or_null_optional_object_are_valid(spark):
    values = [
        (0, 1, b" \r\n\t" + event("e-1")),
        (0, 2, event("e-2", payload=None)),
        (
            0,
            3,
            json.dumps(
                {"event_id": "e-3", "event_type": "view", "occurred_at": "2026-11-01T10:15:00Z"}
            ).encode(),
        ),
        (0, 4, event("e-4", payload={"deep": {"er": [1, {"x": None}]}})),
    ]
    parsed = parse_events(bronze_rows(spark, values), EVENTS, 1024)
    assert quarantined(parsed).count() == 0
    got = {r.event_id: r.payload for r in valid_events(parsed, EVENTS).collect()}
    assert got == {
        "e-1": '{"n":1}',
        "e-2": None,
        "e-3": None,
        "e-4": '{"deep":{"er":[1,{"x":null}]}}',
    }


def test_dedup_keeps_lowest_kafka_position_across_partitions(spark):
    rows = [
        (1, 2, event("a")),
        (0, 9, event("a")),
        (0, 4, event("b")),
        (0, 5, event("b")),
        (2, 0, event("c")),
    ]
    got = dedup_within(
        valid_events(parse_events(bronze_rows(spark, rows), EVENTS, 1024), EVENTS), EVENTS
    )
    assertDataFrameEqual(
        got.select("event_id", "kafka_partition", "kafka_offset"),
        spark.createDataFrame(
            [("a", 0, 9), ("b", 0, 4), ("c", 2, 0)],
            "event_id string, kafka_partition int, kafka_offset long",
        ),
    )


def test_dedup_is_idempotent_and_order_independent(spark):
    rows = [(p, o, event(f"id-{(p * 7 + o) % 5}")) for p in range(3) for o in range(6)]
    events = valid_events(parse_events(bronze_rows(spark, rows), EVENTS, 1024), EVENTS)
    once = dedup_within(events, EVENTS)
    assertDataFrameEqual(dedup_within(once, EVENTS), once)
    assertDataFrameEqual(dedup_within(events.orderBy(F.rand(7)), EVENTS), once)


def test_slice_ids_count_copies_and_keep_the_survivors_date(spark):
    rows = [
        (1, 2, event("a", occurred_at="2026-11-03T08:00:00Z")),
        (0, 9, event("a", occurred_at="2026-10-30T23:59:59Z")),  # the survivor: lower position
        (0, 4, event("b")),
        (2, 0, b"{not json"),  # quarantined: no id
    ]
    ids = slice_ids(
        survivors(
            valid_events(parse_events(bronze_rows(spark, rows), EVENTS, 1024), EVENTS), EVENTS
        ),
        EVENTS,
    )
    assertDataFrameEqual(
        ids,
        spark.createDataFrame(
            [("s1", "a", 2, date(2026, 10, 30)), ("s1", "b", 1, date(2026, 11, 1))],
            "slice_id string, event_id string, copies long, event_date date",
        ),
    )
    span = event_date_span(ids).first()
    assert (span["first"], span["last"]) == (date(2026, 10, 30), date(2026, 11, 1))
    assert span["dates"] == [date(2026, 10, 30), date(2026, 11, 1)]
    assert event_date_span(ids.limit(0)).first()["first"] is None


def test_a_copy_stored_twice_is_deleted_on_both_rows_and_kept_once(spark):
    # `a`: one copy on two rows (a MERGE matched two rows of it); `b`: two copies.
    rows = spark.createDataFrame(
        [("a", 0, 3), ("a", 0, 3), ("b", 1, 7), ("b", 0, 9), ("c", 0, 1)],
        "event_id string, kafka_partition int, kafka_offset long",
    )
    source = kept_once(
        duplicated(rows, EVENTS), EVENTS, ["event_id", "kafka_partition", "kafka_offset"]
    )
    assertDataFrameEqual(
        source,
        spark.createDataFrame(
            [
                ("a", 0, 3, "delete", ["0:3"]),
                ("a", 0, 3, "keep", ["0:3"]),
                ("b", 1, 7, "delete", ["0:9", "1:7"]),
                ("b", 0, 9, "delete", ["0:9", "1:7"]),
                ("b", 0, 9, "keep", ["0:9", "1:7"]),
            ],
            "event_id string, kafka_partition int, kafka_offset long, _op string, "
            "_seen array<string>",
        ),
        checkRowOrder=False,
    )


def test_the_horizon_ranges_and_their_hours():
    (window,) = horizon_ranges([date(2026, 10, 30), date(2026, 11, 1)], 7)
    assert window == (date(2026, 10, 23), date(2026, 11, 8))
    assert window_hours(window) == ("2026-10-23 00:00:00", "2026-11-08 23:00:00")
    assert horizon_ranges([date(2026, 1, 1)], 0) == [(date(2026, 1, 1),) * 2]
    # A late event's date is a range of its own, not the days between it and today's.
    assert horizon_ranges([date(2026, 12, 7), date(2025, 12, 7), date(2026, 12, 6)], 0) == [
        (date(2025, 12, 7), date(2025, 12, 7)),
        (date(2026, 12, 6), date(2026, 12, 7)),
    ]
    assert horizon_ranges([date(2026, 1, 1), date(2026, 1, 4)], 1) == [
        (date(2025, 12, 31), date(2026, 1, 5))
    ]


def test_events_per_hour_counts_by_hour_and_type_within_the_hours(spark):
    rows = [
        ("a", "click", datetime(2026, 11, 1, 10, 15)),
        ("b", "click", datetime(2026, 11, 1, 10, 59, 59)),
        ("c", "view", datetime(2026, 11, 1, 10, 30)),
        ("d", "click", datetime(2026, 11, 1, 11, 0)),
        ("e", "click", datetime(2026, 11, 2, 0, 0)),  # after the last hour: left out
    ]
    silver = spark.createDataFrame(
        rows, "event_id string, event_type string, occurred_at timestamp"
    )
    got = events_per_hour(
        silver, [("2026-11-01 00:00:00", "2026-11-01 23:00:00")], "occurred_at", ("event_type",)
    )
    assertDataFrameEqual(
        got,
        spark.createDataFrame(
            [
                (datetime(2026, 11, 1, 10), "click", 2),
                (datetime(2026, 11, 1, 10), "view", 1),
                (datetime(2026, 11, 1, 11), "click", 1),
            ],
            "hour timestamp, event_type string, events long",
        ),
    )
    # Several ranges (a reach with far dates): each hour within one of them, no other.
    ranges = [
        ("2026-11-01 10:00:00", "2026-11-01 10:00:00"),
        ("2026-11-02 00:00:00", "2026-11-02 23:00:00"),
    ]
    got = events_per_hour(silver, ranges, "occurred_at", ())
    assert sorted((r.hour, r.events) for r in got.collect()) == [
        (datetime(2026, 11, 1, 10), 3),
        (datetime(2026, 11, 2, 0), 1),
    ]


# A second definition (docs/examples/two-pipelines.yaml): a composite key with a nested
# part, a number, allowed values, an epoch-millisecond event time, an optional field.
ORDERS = load_pipelines(REPO / "docs" / "examples" / "two-pipelines.yaml")["orders"]
CREATED = 1793520000000  # 2026-11-01T08:00:00Z in epoch milliseconds


def order(**overrides):
    doc = {
        "tenant": "t1",
        "order": {"id": "o-1", "amount": 12.5},
        "status": "paid",
        "created_at": CREATED,
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


ORDER_DEFECTS = [
    (order(tenant=None), "missing:tenant"),
    (order(tenant=" "), "blank:tenant"),
    (order(tenant=3), "wrong_type:tenant"),
    (order(order={"amount": 1}), "missing:order.id"),
    (order(order={"id": 7, "amount": 1}), "wrong_type:order.id"),
    (order(order={"id": "o", "amount": "1"}), "wrong_type:order.amount"),
    (order(status="lost"), "not_allowed:status"),
    (order(created_at="2026-11-01T08:00:00Z"), "wrong_type:created_at"),  # millis declared
    (order(created_at=10**16), "unparseable_time:created_at"),  # beyond any calendar
    (order(created_at=2**70), "unparseable_time:created_at"),  # and beyond 64 bits
    (order(coupon=5), "wrong_type:coupon"),  # optional, but typed when present
]


@pytest.mark.parametrize(("value", "reason"), ORDER_DEFECTS, ids=[r for _, r in ORDER_DEFECTS])
def test_each_rule_of_a_definition_gives_its_reason(spark, value, reason):
    parsed = parse_events(bronze_rows(spark, [(0, 7, value)]), ORDERS, 1024)
    assert [r.reason for r in quarantined(parsed).collect()] == [reason]
    assert valid_events(parsed, ORDERS).count() == 0


def test_a_nested_composite_key_and_epoch_time_parse_to_silver_columns(spark):
    values = [(0, 1, order()), (1, 2, order(tenant="t2", coupon="WELCOME"))]
    got = valid_events(parse_events(bronze_rows(spark, values), ORDERS, 1024), ORDERS)
    rows = {
        # PySpark gives naive local times; astimezone reads them as local.
        r.tenant: (
            r.order_id,
            r.amount,
            r.status,
            r.created_at.astimezone(timezone.utc),
            r.coupon,
            r.event_date,
        )
        for r in got.collect()
    }
    at = datetime(2026, 11, 1, 8, 0, tzinfo=timezone.utc)
    assert rows == {
        "t1": ("o-1", 12.5, "paid", at, None, date(2026, 11, 1)),
        "t2": ("o-1", 12.5, "paid", at, "WELCOME", date(2026, 11, 1)),
    }
    # Same order id, two tenants: two keys, both survive the dedup.
    assert dedup_within(got, ORDERS).count() == 2


def test_a_survivor_ordered_by_a_field_keeps_the_highest_whatever_the_position(spark):
    versioned = ORDERS.model_copy(
        update={
            "fields": {**ORDERS.fields, "version": FieldSpec(type="integer", required=True)},
            "survivor": Survivor(order_by="version", keep="highest"),
        }
    )
    values = [
        (0, 1, order(version=2)),
        (0, 2, order(version=5)),  # the survivor: highest version, not the lowest offset
        (2, 0, order(version=5)),  # a tie on version: the lower position wins
        (1, 0, order(version=1)),
    ]
    parsed = parse_events(bronze_rows(spark, values), versioned, 1024)
    [kept] = dedup_within(valid_events(parsed, versioned), versioned).collect()
    assert (kept.version, kept.kafka_partition, kept.kafka_offset) == (5, 0, 2)


# A definition keyed on an integer, with an integer and a number beside it, for the
# values a declared type cannot hold: quarantined as out_of_range, never a null.
COUNTERS = PipelinesFile.model_validate(
    {
        "pipelines": {
            "counters": {
                "topic": "counters",
                "key": ["id"],
                "event_time": "at",
                "fields": {
                    "id": {"type": "integer", "required": True},
                    "at": {"type": "timestamp", "required": True, "format": "epoch_millis"},
                    "n": {"type": "integer"},
                    "x": {"type": "number"},
                },
            }
        }
    }
).pipelines["counters"]


def counter(id="1", n="2", x="0.5") -> bytes:
    """A record written as JSON text, each number as given (1e400 has no Python float)."""
    return f'{{"id": {id}, "at": {CREATED}, "n": {n}, "x": {x}}}'.encode()


@pytest.mark.parametrize("field", ["id", "n"])  # the key, and an integer beside it
def test_an_integer_past_64_bits_is_quarantined_and_the_64_bit_edges_are_kept(spark, field):
    held = [2**63 - 1, -(2**63)]
    beyond = [2**70, -(2**70), 2**63, -(2**63) - 1, 2**70]  # 2**70 twice: a re-send
    values = [(0, i, counter(**{field: str(v)})) for i, v in enumerate(held + beyond)]
    parsed = parse_events(bronze_rows(spark, values), COUNTERS, 1024)
    valid = valid_events(parsed, COUNTERS)
    assert {r.kafka_offset: r[field] for r in valid.collect()} == {0: 2**63 - 1, 1: -(2**63)}
    assert {r.offset: r.reason for r in quarantined(parsed).collect()} == {
        offset: f"out_of_range:{field}" for offset in range(len(held), len(values))
    }
    assert dedup_within(valid, COUNTERS).count() == (1 if field == "n" else 2)


def test_a_number_past_a_double_is_quarantined_and_the_largest_double_is_kept(spark):
    held = ["1.7976931348623157e308", "-1.7976931348623157e308", "5e-324"]
    beyond = ["1e400", "-1e400", "2e308"]
    values = [(0, i, counter(x=v)) for i, v in enumerate(held + beyond)]
    parsed = parse_events(bronze_rows(spark, values), COUNTERS, 1024)
    assert {r.kafka_offset: r.x for r in valid_events(parsed, COUNTERS).collect()} == {
        i: float(v) for i, v in enumerate(held)
    }
    assert {r.offset: r.reason for r in quarantined(parsed).collect()} == {
        offset: "out_of_range:x" for offset in range(len(held), len(values))
    }


# An event time far from its record's Kafka timestamp: its own reason, not a slice
# whose MERGE, gate and gold span decades (issue 49).
def test_an_event_at_epoch_0_produced_now_is_out_of_bounds(spark):
    value = event("e-0", occurred_at="1970-01-01T00:00:00Z")
    parsed = parse_events(bronze_rows(spark, [(0, 7, value)]), EVENTS, 1024)
    got = quarantined(parsed).select("partition", "offset", "value", "reason", "slice_id")
    expected = spark.createDataFrame([(0, 7, value, "out_of_bounds:occurred_at", "s1")], got.schema)
    assertDataFrameEqual(got, expected)
    assert valid_events(parsed, EVENTS).count() == 0


def test_a_backfill_of_years_old_events_is_within_the_default_bound(spark):
    assert EVENTS.event_time_bound_days == 3653
    produced = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
    old = "2017-11-03T12:00:00Z"  # 9 years (3286 days) before it was produced
    values = [(0, 1, event("e-1", occurred_at=old))]
    parsed = parse_events(bronze_rows(spark, values, at=produced), EVENTS, 1024)
    assert quarantined(parsed).count() == 0
    [row] = valid_events(parsed, EVENTS).collect()
    assert (row.event_id, row.event_date) == ("e-1", date(2017, 11, 3))


def test_an_event_time_past_the_pipelines_bound_either_way_is_out_of_bounds(spark):
    bounded = PipelinesFile.model_validate(
        {"pipelines": {"events": {**_events_doc(), "event_time_bound_days": 30}}}
    ).pipelines["events"]
    assert bounded.event_time_bound_days == 30

    def at(days):
        return (TS + timedelta(days=days)).isoformat().replace("+00:00", "Z")

    values = [
        (0, 1, event("e-1", occurred_at=at(-31))),
        (0, 2, event("e-2", occurred_at=at(31))),
        (0, 3, event("e-3", occurred_at=at(-29))),
        (0, 4, event("e-4", occurred_at=at(29))),
    ]
    parsed = parse_events(bronze_rows(spark, values), bounded, 1024)
    assert {r.offset: r.reason for r in quarantined(parsed).collect()} == {
        1: "out_of_bounds:occurred_at",
        2: "out_of_bounds:occurred_at",
    }
    assert sorted(r.event_id for r in valid_events(parsed, bounded).collect()) == ["e-3", "e-4"]
    assert "out_of_bounds:occurred_at" in reasons(bounded)


def _events_doc() -> dict:
    """The example's `events` pipeline as its definition file states it."""
    return yaml.safe_load((REPO / "pipelines.yaml").read_text())["pipelines"]["events"]


@pytest.mark.parametrize("bound", [0, -1])
def test_an_event_time_bound_below_a_day_is_a_definition_error(tmp_path, bound):
    path = tmp_path / "pipelines.yaml"
    path.write_text(
        yaml.safe_dump({"pipelines": {"events": {**_events_doc(), "event_time_bound_days": bound}}})
    )
    with pytest.raises(PipelineDefinitionError) as caught:
        load_pipelines(path)
    message = str(caught.value)
    assert "pipelines.events.event_time_bound_days: Input should be greater than or equal to 1" in (
        message
    ), message
