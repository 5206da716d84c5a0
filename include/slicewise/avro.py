"""Avro in the Confluent wire format: which writer schemas a reader schema can read,
and the decode as Spark column expressions.

A record is a magic byte 0, the writer schema's registry id (4 bytes, big-endian)
and the Avro binary body. Each record is decoded with the schema its producer wrote
it with, resolved to the pipeline's reader schema by Avro's rules (fields matched by
name, defaults for fields the writer lacked, promotions such as int to long), so
records written with older or newer compatible schemas land in the same columns.
Spark's `from_avro` does the decode in the JVM, one branch per writer schema.

The decoded record continues as JSON text (`to_json`), into the same parse and rules
as a JSON pipeline's records: one set of field rules, one quarantine, whatever the
format. Before the rules, the wire format has its own reasons (`WIRE_REASONS`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

WIRE_REASONS = (
    "not_wire_format",  # too short, or its first byte is not the magic byte 0
    "unknown_schema_id",  # an id the subject does not hold
    "unreadable_schema",  # a writer schema the reader schema cannot read (Avro's rules)
    "undecodable",  # the body does not decode with its writer schema
)

PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
# Avro's promotions: a writer's type (key) the reader's types (values) may read.
PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}


@dataclass(frozen=True)
class AvroSchemas:
    """What decoding a slice needs: the reader schema and every writer schema by id."""

    reader: str
    writers: dict[int, str]

    def readable(self) -> dict[int, str]:
        """The writer schemas the reader can read, by id."""
        return {i: w for i, w in self.writers.items() if unreadable(self.reader, w) is None}


def unreadable(reader: str, writer: str) -> str | None:
    """Why data written with `writer` cannot be read with `reader` (Avro's schema
    resolution), or None when it can."""
    r, w = json.loads(reader), json.loads(writer)
    return _resolve(_named(r, {}), _named(w, {}), r, w, "")


def _named(schema: Any, names: dict[str, Any]) -> dict[str, Any]:
    """Every named type (record, enum, fixed) of `schema`, by name and full name."""
    if isinstance(schema, list):
        for branch in schema:
            _named(branch, names)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "enum", "fixed", "error") and "name" in schema:
            name = schema["name"]
            names[name] = schema
            names[name.rsplit(".", 1)[-1]] = schema
            if schema.get("namespace"):
                names[f"{schema['namespace']}.{name}"] = schema
        for f in schema.get("fields", []):
            _named(f["type"], names)
        for key in ("items", "values"):
            if key in schema:
                _named(schema[key], names)
        if isinstance(kind, (dict, list)):
            _named(kind, names)
    return names


def _kind(schema: Any, names: dict[str, Any]) -> Any:
    """`schema` with a reference to a named type replaced by its definition."""
    while isinstance(schema, str) and schema not in PRIMITIVES and schema in names:
        schema = names[schema]
    if isinstance(schema, dict) and isinstance(schema.get("type"), (str, list, dict)):
        inner = schema["type"]
        if isinstance(inner, str) and inner in PRIMITIVES:
            return inner  # {"type": "long", "logicalType": ...}: its base type
        if isinstance(inner, (list, dict)):
            return _kind(inner, names)
    return schema


def _type_name(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    return str(schema.get("type"))


def _resolve(rnames: dict, wnames: dict, reader: Any, writer: Any, at: str) -> str | None:
    r, w = _kind(reader, rnames), _kind(writer, wnames)
    where = at or "the record"
    if isinstance(w, list):  # every branch the writer may have used must be readable
        for branch in w:
            why = _resolve(rnames, wnames, r, branch, at)
            if why is not None:
                return why
        return None
    if isinstance(r, list):  # some branch of the reader must read the writer's type
        if any(_resolve(rnames, wnames, branch, w, at) is None for branch in r):
            return None
        return f"{where}: the writer's {_type_name(w)} matches no branch of the reader's union"
    rt, wt = _type_name(r), _type_name(w)
    if rt != wt:
        if wt in PROMOTIONS and rt in PROMOTIONS[wt]:
            return None
        return f"{where}: the writer's {wt} cannot be read as {rt}"
    if rt == "record":
        if r["name"].rsplit(".", 1)[-1] != w["name"].rsplit(".", 1)[-1]:
            return f"{where}: record {w['name']} cannot be read as record {r['name']}"
        written = {f["name"]: f for f in w.get("fields", [])}
        for f in r.get("fields", []):
            path = f"{at}.{f['name']}" if at else f["name"]
            source = written.get(f["name"]) or next(
                (written[a] for a in f.get("aliases", []) if a in written), None
            )
            if source is None:
                if "default" not in f:
                    return f"{path}: the reader's field has no default and the writer lacks it"
                continue
            why = _resolve(rnames, wnames, f["type"], source["type"], path)
            if why is not None:
                return why
        return None
    if rt == "enum":
        missing = set(w["symbols"]) - set(r["symbols"])
        if missing and "default" not in r:
            return f"{where}: the reader's enum lacks {sorted(missing)} and has no default"
        return None
    if rt == "fixed":
        if r["size"] != w["size"]:
            return f"{where}: fixed of {w['size']} bytes cannot be read as {r['size']}"
        return None
    if rt == "array":
        return _resolve(rnames, wnames, r["items"], w["items"], f"{at}[]")
    if rt == "map":
        return _resolve(rnames, wnames, r["values"], w["values"], f"{at}{{}}")
    return None


def schema_id(value: Column) -> Column:
    """The writer schema's id: bytes 2-5 of the record, big-endian."""
    return F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("bigint")


def wire_format_ok(value: Column) -> Column:
    return (F.length(value) >= 5) & (F.hex(F.substring(value, 1, 1)) == F.lit("00"))


def decoded_text(value: Column, schemas: AvroSchemas) -> Column:
    """The record decoded by its writer schema into the reader's, as JSON text; null
    when its schema is not one the reader reads. A body that does not decode gives
    "{}": Spark's permissive decoder returns a record of nulls."""
    from pyspark.sql.avro.functions import from_avro

    body = F.substring(value, 6, 2**31 - 1)  # the rest, whatever its length
    ids = schema_id(value)
    decoded: Column | None = None
    for sid, writer in sorted(schemas.readable().items()):
        branch = from_avro(body, writer, {"avroSchema": schemas.reader, "mode": "PERMISSIVE"})
        decoded = (F if decoded is None else decoded).when(ids == F.lit(sid), branch)
    return F.lit(None).cast("string") if decoded is None else F.to_json(decoded)


def wire_reason(value: Column, text: Column, schemas: AvroSchemas) -> Column:
    """Why the record (`text`: `decoded_text`) is not readable, or null when it is.

    A record all of whose fields are null is taken for one that did not decode: the
    decoder tells nothing else, and such a record lacks the pipeline's key anyway."""
    ids = schema_id(value)
    readable = list(schemas.readable())
    return (
        F.when(~wire_format_ok(value), "not_wire_format")
        .when(
            ~ids.isin(list(schemas.writers)) if schemas.writers else F.lit(True),
            "unknown_schema_id",
        )
        .when(~ids.isin(readable) if readable else F.lit(True), "unreadable_schema")
        .when(text.isNull() | (text == F.lit("{}")), "undecodable")
    )
