"""Which writer schemas a reader schema can read: Avro's resolution rules, as the
pipeline applies them before decoding (the JVM's decoder is the final judge)."""

from __future__ import annotations

import json

import pytest

from slicewise.avro import AvroSchemas, unreadable


def record(*fields: dict, name: str = "Event") -> str:
    return json.dumps({"type": "record", "name": name, "fields": list(fields)})


ID = {"name": "id", "type": "string"}
TS = {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}


@pytest.mark.parametrize(
    ("reader", "writer"),
    [
        (record(ID, TS), record(ID, TS)),
        # a field the writer lacks, with a default; one the reader lacks is skipped
        (
            record(ID, TS, {"name": "c", "type": ["null", "string"], "default": None}),
            record(ID, TS),
        ),
        (record(ID), record(ID, TS)),
        # promotions
        (record({"name": "n", "type": "long"}), record({"name": "n", "type": "int"})),
        (record({"name": "n", "type": "double"}), record({"name": "n", "type": "float"})),
        (record({"name": "s", "type": "bytes"}), record({"name": "s", "type": "string"})),
        # a writer's type read by a branch of the reader's union, a writer union whose
        # every branch the reader reads
        (
            record({"name": "s", "type": ["null", "string"]}),
            record({"name": "s", "type": "string"}),
        ),
        (record({"name": "n", "type": "long"}), record({"name": "n", "type": ["int", "long"]})),
        # enums, arrays, maps, nested records, aliases
        (
            record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}),
            record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}),
        ),
        (
            record({"name": "xs", "type": {"type": "array", "items": "long"}}),
            record({"name": "xs", "type": {"type": "array", "items": "int"}}),
        ),
        (
            record({"name": "m", "type": {"type": "map", "values": "string"}}),
            record({"name": "m", "type": {"type": "map", "values": "string"}}),
        ),
        (
            record({"name": "p", "type": json.loads(record(ID, name="P"))}),
            record({"name": "p", "type": json.loads(record(ID, TS, name="P"))}),
        ),
        (
            record({"name": "new", "type": "string", "aliases": ["old"]}),
            record({"name": "old", "type": "string"}),
        ),
    ],
)
def test_readable(reader, writer):
    assert unreadable(reader, writer) is None


@pytest.mark.parametrize(
    ("reader", "writer", "why"),
    [
        (
            record(ID, {"name": "c", "type": "string"}),
            record(ID),
            "c: the reader's field has no default",
        ),
        (
            record({"name": "n", "type": "int"}),
            record({"name": "n", "type": "long"}),
            "n: the writer's long cannot be read as int",
        ),
        (
            record({"name": "s", "type": "string"}),
            record({"name": "s", "type": ["null", "string"]}),
            "s: the writer's null cannot be read as string",
        ),
        (
            record({"name": "n", "type": ["null", "long"]}),
            record({"name": "n", "type": "string"}),
            "n: the writer's string matches no branch",
        ),
        (
            record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}),
            record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}),
            "e: the reader's enum lacks ['B']",
        ),
        (
            record(ID, name="Order"),
            record(ID, name="Event"),
            "the record: record Event cannot be read as record Order",
        ),
        (
            record(
                {"name": "p", "type": json.loads(record({"name": "q", "type": "int"}, name="P"))}
            ),
            record(
                {"name": "p", "type": json.loads(record({"name": "q", "type": "string"}, name="P"))}
            ),
            "p.q: the writer's string cannot be read as int",
        ),
    ],
)
def test_unreadable_names_the_field_and_the_rule(reader, writer, why):
    found = unreadable(reader, writer)
    assert found is not None and found.startswith(why), found


def test_named_types_are_resolved_by_reference():
    point = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "int"}]}
    both = record({"name": "a", "type": point}, {"name": "b", "type": "Point"})
    assert unreadable(both, both) is None
    wider = record(
        {"name": "a", "type": {**point, "fields": [{"name": "x", "type": "long"}]}},
        {"name": "b", "type": "Point"},
    )
    assert unreadable(wider, both) is None
    assert unreadable(both, wider) == "a.x: the writer's long cannot be read as int"


def test_the_schemas_a_slice_decodes_are_the_readable_ones():
    reader = record(ID, TS)
    schemas = AvroSchemas(reader, {1: record(ID, TS), 2: record(ID), 3: record(ID, TS, name="X")})
    assert schemas.readable() == {1: record(ID, TS)}
