"""A pipeline definition compiled to Spark: silver's schema, the parse and its rules.

The parse turns each bronze record into the declared columns and a `reason`
(null when the record keeps the contract). It is built from column expressions
only (a variant parse, typed extraction, rule expressions), never a Python UDF,
so Spark evaluates it in the JVM at the speed of the hand-written equivalent.

A record's reason is the first rule it breaks: the record-level rules
(`RECORD_REASONS`), then each declared field in the definition's order:

  missing:<field>          a required field is absent or null
  wrong_type:<field>       present with another JSON type (a number for a string,
                           ...): a changed type is quarantined, never coerced
  blank:<field>            a string that is empty or only whitespace
  not_allowed:<field>      a value outside the field's `allowed` list
  unparseable_time:<field> a timestamp/date that does not match its format

Why a variant parse rather than `from_json` with the typed schema: `from_json`
turns any JSON token read into a string field into its text (42 -> "42"), so it
cannot prove a string type, and it cannot tell an absent field from a null one.
The variant keeps each value's JSON type, which the rules check.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from slicewise.avro import WIRE_REASONS, AvroSchemas, decoded_text, wire_reason
from slicewise.pipelines import EPOCH_FORMATS, FieldSpec, Pipeline

DEFAULT_FORMATS = {"timestamp": "yyyy-MM-dd'T'HH:mm:ss[.SSSSSSSSS]XXX", "date": "yyyy-MM-dd"}

RECORD_REASONS = ("null_value", "oversized_value", "invalid_utf8", "invalid_json", "not_an_object")
FIELD_RULES = ("missing", "wrong_type", "blank", "not_allowed", "unparseable_time")

SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
    "timestamp": TimestampType(),
    "date": DateType(),
    "object": StringType(),  # JSON text
    "array": StringType(),  # JSON text
}
# What `try_variant_get` extracts a present value as, before a time is parsed.
_EXTRACT = {
    "string": "string",
    "integer": "bigint",
    "number": "double",
    "boolean": "boolean",
}
KAFKA_POSITION = ("kafka_partition", "kafka_offset")


def reasons(pipeline: Pipeline) -> tuple[str, ...]:
    """Every reason this pipeline's quarantine can hold."""
    wire = WIRE_REASONS if pipeline.format == "avro" else ()
    return (
        RECORD_REASONS
        + wire
        + tuple(f"{rule}:{path}" for path in pipeline.fields for rule in FIELD_RULES)
    )


def _format(spec: FieldSpec) -> str:
    return spec.format or DEFAULT_FORMATS[spec.type]


def _is_epoch(spec: FieldSpec) -> bool:
    return spec.type == "timestamp" and _format(spec) in EPOCH_FORMATS


def silver_schema(pipeline: Pipeline) -> StructType:
    """Silver's columns: the declared fields, the event date, the Kafka position, the slice."""
    return StructType(
        [
            *[
                StructField(pipeline.column_of(path), SPARK_TYPES[spec.type], not spec.required)
                for path, spec in pipeline.fields.items()
            ],
            StructField("event_date", DateType(), False),
            StructField("kafka_partition", IntegerType(), False),
            StructField("kafka_offset", LongType(), False),
            StructField("kafka_timestamp", TimestampType(), True),
            StructField("slice_id", StringType(), False),
        ]
    )


def slice_ids_schema(pipeline: Pipeline) -> StructType:
    """Per slice, its valid events' distinct keys, their copies and surviving event date
    (written by silver, read by the gate and publish in place of a second parse)."""
    silver = {f.name: f for f in silver_schema(pipeline).fields}
    return StructType(
        [
            StructField("slice_id", StringType(), False),
            *[silver[c] for c in pipeline.key_columns],
            StructField("copies", LongType(), False),
            StructField("event_date", DateType(), False),
        ]
    )


def required_columns(pipeline: Pipeline) -> tuple[str, ...]:
    """Silver columns that may never be null."""
    return (
        *[pipeline.column_of(p) for p, spec in pipeline.fields.items() if spec.required],
        "event_date",
    )


def survivor_order(pipeline: Pipeline) -> list[Column]:
    """The order among copies of one key: the first survives."""
    position = [F.col(c).asc() for c in KAFKA_POSITION]
    if pipeline.survivor is None:
        return position
    column = F.col(pipeline.column_of(pipeline.survivor.order_by))
    first = column.desc() if pipeline.survivor.keep == "highest" else column.asc()
    return [first, *position]


def beats_sql(pipeline: Pipeline) -> str:
    """The survivor order as a MERGE condition: source copy `s` beats stored copy `t`."""
    earlier = (
        "(s.kafka_partition < t.kafka_partition OR "
        "(s.kafka_partition = t.kafka_partition AND s.kafka_offset < t.kafka_offset))"
    )
    if pipeline.survivor is None:
        return earlier
    c = f"`{pipeline.column_of(pipeline.survivor.order_by)}`"
    better = ">" if pipeline.survivor.keep == "highest" else "<"
    return f"(s.{c} {better} t.{c} OR (s.{c} = t.{c} AND {earlier}))"


def key_match_sql(pipeline: Pipeline) -> str:
    return " AND ".join(f"t.`{c}` = s.`{c}`" for c in pipeline.key_columns)


def _variant_path(path: str) -> str:
    return "$" + "".join(f"['{segment}']" for segment in path.split("."))


def _blank(text: Column) -> Column:
    """Empty or only whitespace: Unicode White_Space (F.trim strips only spaces, so a
    tab-only id would pass for one)."""
    return text.rlike(r"(?U)^\s*$")


def _kind_ok(spec: FieldSpec, kind: Column) -> Column:
    """Does the value's JSON type (`schema_of_variant`) fit the declared type?"""
    integral = (kind == "BIGINT") | kind.rlike(r"^DECIMAL\(\d+,0\)$")
    numeric = (kind == "BIGINT") | kind.startswith("DECIMAL") | (kind == "DOUBLE")
    if spec.type == "integer" or (_is_epoch(spec) and _format(spec) == "epoch_millis"):
        return integral
    if spec.type == "number" or _is_epoch(spec):
        return numeric
    if spec.type == "boolean":
        return kind == "BOOLEAN"
    if spec.type == "object":
        return kind.startswith("OBJECT")
    if spec.type == "array":
        return kind.startswith("ARRAY")
    return kind == "STRING"  # string, and timestamp/date written as text


def parse_events(
    bronze: DataFrame, pipeline: Pipeline, max_value_bytes: int, avro: AvroSchemas | None = None
) -> DataFrame:
    """Bronze rows with the declared columns, `event_date` and a `reason` (null when valid).

    A JSON pipeline's record is its value's text; an Avro pipeline's (`avro`: the
    schemas of its subject) is the value decoded and written as JSON text
    (`avro.decoded_text`), with the wire format's reasons ahead of the rules.

    Built in stages (parse, read fields, type them, judge), each a projection of its
    own, so a materialized result parses each document once: Spark keeps a projection
    apart from the next when merging them would repeat a costly expression. A filter on
    `reason` is still pushed below the stages and evaluated inline, re-parsing the
    document in each branch of the rules (~4x the cost on 500k records): filter a
    cached result (`silver.parsed_slice`).
    """
    fields = list(pipeline.fields.items())
    names = {path: f"_f{i}" for i, (path, _) in enumerate(fields)}
    if avro is None:
        source = bronze.select(
            "*",
            F.col("value").cast("string").alias("_text"),
            F.lit(None).cast("string").alias("_wire"),
        )
    else:
        # Two projections: the decode runs once, then its text is judged.
        decoded = bronze.select("*", decoded_text(F.col("value"), avro).alias("_decoded"))
        wire = wire_reason(F.col("value"), F.col("_decoded"), avro)
        source = decoded.select(
            *bronze.columns,
            F.when(wire.isNull(), F.col("_decoded")).alias("_text"),
            wire.alias("_wire"),
        )
    text = F.col("_text")
    docs = source.select("*", F.try_parse_json(text).alias("_doc"))
    read = docs.select(
        "*",
        # A parsed document is an object iff its text opens with "{": far cheaper than
        # `schema_of_variant`, which walks the whole document to name its type.
        text.rlike(r"^[ \t\n\r]*\{").alias("_is_object"),
        *[
            F.try_variant_get("_doc", _variant_path(path), "variant").alias(names[path])
            for path, _ in fields
        ],
    )
    typed = read.select(
        "*",
        *[
            _extract(F.col(names[path]), spec).alias(f"{names[path]}_value")
            for path, spec in fields
        ],
    )
    timed = typed.select(
        "*",
        *[
            _kind(F.col(names[path]), F.col(f"{names[path]}_value"), spec).alias(
                f"{names[path]}_kind"
            )
            for path, spec in fields
        ],
        *[
            _as_time(F.col(f"{names[path]}_value"), spec).alias(f"{names[path]}_time")
            for path, spec in fields
            if spec.type in ("timestamp", "date")
        ],
    )

    reason = F.when(F.col("value").isNull(), "null_value").when(
        F.length("value") > max_value_bytes, "oversized_value"
    )
    if avro is None:
        reason = reason.when(~F.is_valid_utf8(text), "invalid_utf8")
    else:
        reason = reason.when(F.col("_wire").isNotNull(), F.col("_wire"))
    reason = reason.when(F.col("_doc").isNull(), "invalid_json").when(
        ~F.col("_is_object"), "not_an_object"
    )
    for path, spec in fields:
        n = names[path]
        raw, kind, value = F.col(n), F.col(f"{n}_kind"), F.col(f"{n}_value")
        absent = raw.isNull() | F.is_variant_null(raw)
        if spec.required:
            reason = reason.when(absent, f"missing:{path}")
        reason = reason.when(~absent & ~_kind_ok(spec, kind), f"wrong_type:{path}")
        if spec.type == "string" and not spec.allow_blank:
            reason = reason.when(~absent & _blank(value), f"blank:{path}")
        if spec.allowed is not None:
            allowed = F.array(*[F.lit(v) for v in spec.allowed])
            reason = reason.when(~absent & ~F.array_contains(allowed, value), f"not_allowed:{path}")
        if spec.type in ("timestamp", "date"):
            reason = reason.when(~absent & F.col(f"{n}_time").isNull(), f"unparseable_time:{path}")

    def column(path: str, spec: FieldSpec) -> Column:
        n = names[path]
        if spec.type in ("timestamp", "date"):
            return F.col(f"{n}_time")
        if spec.type in ("object", "array"):
            # A JSON null is no value, as for the other types (not the text "null").
            return F.when(~F.is_variant_null(F.col(n)), F.col(f"{n}_value"))
        return F.col(f"{n}_value")

    event_time = column(pipeline.event_time, pipeline.fields[pipeline.event_time])
    return timed.select(
        *[F.col(c) for c in bronze.columns],
        *[column(path, spec).alias(pipeline.column_of(path)) for path, spec in fields],
        F.to_date(event_time).alias("event_date"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        reason.alias("reason"),
    )


def _kind(raw: Column, value: Column, spec: FieldSpec) -> Column:
    """The value's JSON type as `schema_of_variant` names it; null when absent.

    For an object or array field only the opening character of its JSON text
    (`value`, from `_extract`) is looked at: `schema_of_variant` would walk the whole
    value (an object's type names every nested field)."""
    if spec.type in ("object", "array"):
        opening = F.substring(value, 1, 1)
        return (
            F.when(raw.isNull(), F.lit(None))
            .when(opening == "{", F.lit("OBJECT"))
            .when(opening == "[", F.lit("ARRAY"))
            .otherwise(F.schema_of_variant(raw))
        )
    return F.when(raw.isNull(), F.lit(None)).otherwise(F.schema_of_variant(raw))


def _extract(raw: Column, spec: FieldSpec) -> Column:
    """The value as its declared scalar (before a time is parsed); an object's or
    array's JSON text, written once for its kind and its column."""
    if spec.type in ("object", "array"):
        return F.to_json(raw)
    if _is_epoch(spec):
        as_type = "bigint" if _format(spec) == "epoch_millis" else "double"
    else:
        as_type = _EXTRACT.get(spec.type, "string")
    return F.try_variant_get(raw, "$", as_type)


def _as_time(value: Column, spec: FieldSpec) -> Column:
    fmt = _format(spec)
    # Out of range (beyond year ~5000) is unparseable, not an overflow error.
    if fmt == "epoch_millis":
        return F.when(value.between(-(10**14), 10**14), F.timestamp_millis(value))
    if fmt == "epoch_seconds":
        micros = (value * 1_000_000).cast("bigint")
        return F.when(value.between(-(10**11), 10**11), F.timestamp_micros(micros))
    stamp = F.try_to_timestamp(value, F.lit(fmt))
    return stamp if spec.type == "timestamp" else F.to_date(stamp)
