"""Property-based tests (hypothesis) over generated pipeline definitions and records on
real Spark: every record ends valid or quarantined with a reason of its definition,
a number its declared type cannot hold is quarantined rather than stored as a null,
and the in-slice dedup is order-independent for any key shape."""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone
from pathlib import Path

from builders import bronze_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.testing import assertDataFrameEqual

from slicewise.contract import parse_events, reasons
from slicewise.pipelines import (
    PipelinesFile,
)
from slicewise.schemas import silver_schema
from slicewise.transforms import dedup_within, quarantined, valid_events

REPO = Path(__file__).resolve().parents[2]
BATCHES = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


segments = st.sampled_from(["a", "b", "id", "k", "x_y", "n1"])
paths = st.lists(segments, min_size=1, max_size=3).map(".".join)
KEY_TYPES = ["string", "integer"]
OTHER_TYPES = ["string", "integer", "number", "boolean", "object", "array"]


def _no_prefix_clash(all_paths: list[str]) -> bool:
    """No path may be another's parent: `a` a string and `a.b` a field cannot both hold."""
    return not any(p != q and q.startswith(p + ".") for p in all_paths for q in all_paths)


@st.composite
def definitions(draw):
    names = draw(st.lists(paths, min_size=3, max_size=6, unique=True).filter(_no_prefix_clash))
    columns = [n.replace(".", "_") for n in names]
    if len(set(columns)) != len(columns):  # a.b and a_b: same column, refused by validation
        names = [n for n, c in zip(names, columns, strict=True) if columns.count(c) == 1]
    if len(names) < 3:
        names = ["k1", "k2", "t"]
    n_key = draw(st.integers(1, min(2, len(names) - 1)))
    key, time_field, others = names[:n_key], names[n_key], names[n_key + 1 :]
    time_format = draw(st.sampled_from(["iso", "epoch_millis"]))
    fields = {k: {"type": draw(st.sampled_from(KEY_TYPES)), "required": True} for k in key}
    fields[time_field] = {"type": "timestamp", "required": True}
    if time_format == "epoch_millis":
        fields[time_field]["format"] = "epoch_millis"
    for other in others:
        kind = draw(st.sampled_from(OTHER_TYPES))
        spec = {"type": kind, "required": draw(st.booleans())}
        if kind == "string" and draw(st.booleans()):
            spec["allowed"] = ["red", "green"]
        fields[other] = spec
    survivor = draw(st.sampled_from([None, "highest", "lowest"]))
    doc = {"topic": "t", "key": key, "event_time": time_field, "fields": fields}
    if survivor:
        doc["survivor"] = {"order_by": time_field, "keep": survivor}
    return PipelinesFile.model_validate({"pipelines": {"gen": doc}}).pipelines["gen"]


def value_for(spec, draw):
    kind = spec.type
    if kind == "string":
        if spec.allowed:
            return draw(st.sampled_from(list(spec.allowed)))
        return draw(st.text(alphabet="abcxyz-", min_size=1, max_size=6))
    if kind == "integer":
        return draw(st.integers(-(10**12), 10**12))
    if kind == "number":
        return draw(st.floats(-1e6, 1e6, allow_nan=False))
    if kind == "boolean":
        return draw(st.booleans())
    if kind == "object":
        return {"n": draw(st.integers(0, 9))}
    if kind == "array":
        return [draw(st.integers(0, 9))]
    # Within the default event-time bound (ten years) of the records' Kafka timestamp.
    at = draw(
        st.datetimes(datetime(2017, 1, 1), datetime(2036, 6, 30), timezones=st.just(timezone.utc))
    )
    if spec.format == "epoch_millis":
        return int(at.timestamp() * 1000)
    return at.isoformat(timespec="seconds")


def put(doc: dict, path: str, value) -> dict:
    node = doc
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return doc


def wrong_value(spec):
    """A JSON value of another type than declared."""
    return 42 if spec.type in ("string", "boolean", "object", "array") else "42"


@st.composite
def records(draw, pipeline):
    """(value bytes, the field a defect was put in, or None for a valid record)."""
    doc: dict = {}
    for path, spec in pipeline.fields.items():
        if spec.required or draw(st.booleans()):
            put(doc, path, value_for(spec, draw))
    defect = draw(st.sampled_from([None, "missing", "wrong_type", "garbage"]))
    if defect is None:
        return json.dumps(doc).encode(), None
    if defect == "garbage":
        return draw(st.sampled_from([b"{oops", b"[1]", b"\xff"])), "garbage"
    required = [p for p, s in pipeline.fields.items() if s.required]
    target = draw(st.sampled_from(required))
    if defect == "missing":
        put(doc, target, None)
    else:
        put(doc, target, wrong_value(pipeline.fields[target]))
    return json.dumps(doc).encode(), target


@BATCHES
@given(data=st.data())
def test_every_record_of_any_definition_is_valid_or_quarantined_with_its_reason(spark, data):
    pipeline = data.draw(definitions())
    batch = data.draw(st.lists(records(pipeline), min_size=1, max_size=25))
    parsed = parse_events(
        bronze_rows(spark, [(0, i, v) for i, (v, _) in enumerate(batch)]), pipeline, 4096
    ).cache()
    good = {r.kafka_offset: r for r in valid_events(parsed, pipeline).collect()}
    bad = {r.offset: r.reason for r in quarantined(parsed).collect()}

    assert not good.keys() & bad.keys()  # never both
    assert good.keys() | bad.keys() == set(range(len(batch)))  # nothing lost
    assert set(bad.values()) <= set(reasons(pipeline))
    for offset, (value, defect) in enumerate(batch):
        if defect is None:
            assert offset in good, (value, bad.get(offset))
            row = good[offset]
            assert all(getattr(row, c) is not None for c in pipeline.key_columns)
        elif defect == "garbage":
            assert bad[offset] in ("invalid_json", "not_an_object", "invalid_utf8")
        else:  # the one broken field is the one the reason names
            assert bad.get(offset, "").endswith(f":{defect}"), (value, bad.get(offset))
    assert [f.name for f in valid_events(parsed, pipeline).schema.fields] == [
        f.name for f in silver_schema(pipeline).fields
    ]
    parsed.unpersist()


# Integers past 64 bits that the parse still holds exactly, as a decimal of up to 38
# digits (a longer one it holds as a double: a wrong type for an integer field).
BEYOND_64_BITS = (
    st.sampled_from([2**70, -(2**70), 2**63, -(2**63) - 1])
    | st.integers(2**63, 10**38 - 1)
    | st.integers(-(10**38) + 1, -(2**63) - 1)
)
INT64_EDGES = st.sampled_from([2**63 - 1, -(2**63)])
# Written as JSON text: Python's json writes an infinity as `Infinity`, which is not JSON.
BEYOND_DOUBLE = st.sampled_from(["1e400", "-1e400", "2e308", "-1.8e308"])
DOUBLE_EDGES = st.sampled_from([1.7976931348623157e308, -1.7976931348623157e308, 5e-324])


def _has_numbers(pipeline) -> bool:
    return any(s.type in ("integer", "number") for s in pipeline.fields.values())


@BATCHES
@given(data=st.data())
def test_a_number_its_declared_type_cannot_hold_is_quarantined_never_stored_as_null(spark, data):
    pipeline = data.draw(definitions().filter(_has_numbers))
    numeric = [p for p, s in pipeline.fields.items() if s.type in ("integer", "number")]
    batch = []  # (value, the field set, the value it must hold, or None: out of range)
    for _ in range(data.draw(st.integers(1, 12))):
        doc: dict = {}
        for path, spec in pipeline.fields.items():
            if spec.required:
                put(doc, path, value_for(spec, data.draw))
        target = data.draw(st.sampled_from(numeric))
        integer = pipeline.fields[target].type == "integer"
        if data.draw(st.booleans()):
            held = data.draw(INT64_EDGES if integer else DOUBLE_EDGES)
            batch.append((json.dumps(put(doc, target, held)).encode(), target, held))
        else:
            beyond = str(data.draw(BEYOND_64_BITS)) if integer else data.draw(BEYOND_DOUBLE)
            text = json.dumps(put(doc, target, "@beyond@")).replace('"@beyond@"', beyond)
            batch.append((text.encode(), target, None))
    parsed = parse_events(
        bronze_rows(spark, [(0, i, v) for i, (v, _, _) in enumerate(batch)]), pipeline, 4096
    ).cache()
    good = {r.kafka_offset: r for r in valid_events(parsed, pipeline).collect()}
    bad = {r.offset: r.reason for r in quarantined(parsed).collect()}

    assert set(bad.values()) <= set(reasons(pipeline))
    for offset, (value, target, held) in enumerate(batch):
        if held is None:
            assert offset not in good, (value, good.get(offset))
            assert bad.get(offset) == f"out_of_range:{target}", value
        else:  # the edges of the declared type are kept, exactly
            assert offset in good, (value, bad.get(offset))
            assert getattr(good[offset], pipeline.column_of(target)) == held, value
    parsed.unpersist()


@BATCHES
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_dedup_is_order_independent_for_any_key_shape(spark, data, seed):
    pipeline = data.draw(definitions())
    pool: list[dict] = [{} for _ in range(4)]  # up to four keys, each sent several times
    for doc in pool:
        for path, spec in pipeline.fields.items():
            if spec.required:
                put(doc, path, value_for(spec, data.draw))
    positions = data.draw(
        st.lists(
            st.tuples(st.integers(0, 3), st.integers(0, 300)), min_size=1, max_size=30, unique=True
        )
    )
    rows = []
    for p, o in positions:
        doc = json.loads(json.dumps(data.draw(st.sampled_from(pool))))
        put(doc, pipeline.event_time, value_for(pipeline.fields[pipeline.event_time], data.draw))
        rows.append((p, o, json.dumps(doc).encode()))

    def dedup(order):
        events = valid_events(parse_events(bronze_rows(spark, order), pipeline, 4096), pipeline)
        return dedup_within(events, pipeline)

    once = dedup(rows)
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    assertDataFrameEqual(dedup(shuffled), once)
    assertDataFrameEqual(dedup_within(once, pipeline), once)

    # The survivor of each key, computed here from the rule the definition states.
    def get(doc, path):
        for part in path.split("."):
            doc = doc[part]
        return doc

    def rank(row):
        p, o, value = row
        if pipeline.survivor is None:
            return (p, o)
        at = get(json.loads(value), pipeline.event_time)
        t = at if isinstance(at, int) else datetime.fromisoformat(at).timestamp()
        return (-t if pipeline.survivor.keep == "highest" else t, p, o)

    expected: dict[tuple, tuple[int, int]] = {}
    for row in sorted(rows, key=rank, reverse=True):  # the best copy last: it stays
        doc = json.loads(row[2])
        expected[tuple(get(doc, k) for k in pipeline.key)] = row[:2]
    got = {
        tuple(r[c] for c in pipeline.key_columns): (r.kafka_partition, r.kafka_offset)
        for r in once.collect()
    }
    assert got == expected
