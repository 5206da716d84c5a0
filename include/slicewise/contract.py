"""A pipeline definition compiled to Spark: the parse and its rules, the survivor order.

The parse turns each bronze record into the declared columns and a `reason`
(null when the record keeps the contract). It is built from column expressions
only (a variant parse, typed extraction, rule expressions), never a Python UDF,
so Spark evaluates it in the JVM at the speed of the hand-written equivalent.

A record's reason is the first rule it breaks: the record-level rules
(`RECORD_REASONS`), then each declared field in the definition's order:

  missing:<field>          a required field is absent or null
  wrong_type:<field>       present with another JSON type (a number for a string,
                           ...): a changed type is quarantined, never coerced
  out_of_range:<field>     a number of the right JSON type that the declared type
                           cannot hold (an integer past 64 bits, a number past a
                           double): quarantined, never stored as a null
  blank:<field>            a string that is empty or only whitespace
  not_allowed:<field>      a value outside the field's `allowed` list
  unparseable_time:<field> a timestamp/date that does not match its format
  out_of_bounds:<field>    the event-time field only, after its rules above: a time
                           more than `event_time_bound_days` from the record's own
                           Kafka timestamp, either way (one event at epoch 0 would
                           otherwise widen its slice's MERGE, gate and gold to decades)

Why a variant parse rather than `from_json` with the typed schema: `from_json`
turns any JSON token read into a string field into its text (42 -> "42"), so it
cannot prove a string type, and it cannot tell an absent field from a null one.
The variant keeps each value's JSON type, which the rules check.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from slicewise.avro import WIRE_REASONS, AvroSchemas, decoded_text, wire_reason
from slicewise.pipelines import EPOCH_FORMATS, FieldSpec, Pipeline
from slicewise.schemas import KAFKA_POSITION

DEFAULT_FORMATS = {"timestamp": "yyyy-MM-dd'T'HH:mm:ss[.SSSSSSSSS]XXX", "date": "yyyy-MM-dd"}

RECORD_REASONS = ("null_value", "oversized_value", "invalid_utf8", "invalid_json", "not_an_object")
FIELD_RULES = (
    "missing",
    "wrong_type",
    "out_of_range",
    "blank",
    "not_allowed",
    "unparseable_time",
)

# What `try_variant_get` extracts a present value as, before a time is parsed.
_EXTRACT = {
    "string": "string",
    "integer": "bigint",
    "number": "double",
    "boolean": "boolean",
}


def reasons(pipeline: Pipeline) -> tuple[str, ...]:
    """Every reason this pipeline's quarantine can hold."""
    wire = WIRE_REASONS if pipeline.format == "avro" else ()
    return (
        RECORD_REASONS
        + wire
        + tuple(f"{rule}:{path}" for path in pipeline.fields for rule in FIELD_RULES)
        + (f"out_of_bounds:{pipeline.event_time}",)
    )


def _format(spec: FieldSpec) -> str:
    return spec.format or DEFAULT_FORMATS[spec.type]


def _is_epoch(spec: FieldSpec) -> bool:
    return spec.type == "timestamp" and _format(spec) in EPOCH_FORMATS


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

    Built in named stages (`record_text`, `read_fields`, `typed_fields`, then
    `quarantine_reason` and `declared_columns` over them), each a projection of its
    own, so a materialized result parses each document once: Spark keeps a projection
    apart from the next when merging them would repeat a costly expression. A filter on
    `reason` is still pushed below the stages and evaluated inline, re-parsing the
    document in each branch of the rules (~4x the cost on 500k records): filter a
    cached result (`silver.parsed_slice`).
    """
    staged = typed_fields(read_fields(record_text(bronze, avro), pipeline), pipeline)
    return staged.select(
        *[F.col(c) for c in bronze.columns],
        *declared_columns(pipeline),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        quarantine_reason(pipeline, max_value_bytes, wire=avro is not None).alias("reason"),
    )


def _staged(pipeline: Pipeline) -> list[tuple[str, FieldSpec, str]]:
    """Each declared field with the name of its stage columns (`_f<i>`, `_f<i>_value`, ...)."""
    return [(path, spec, f"_f{i}") for i, (path, spec) in enumerate(pipeline.fields.items())]


def record_text(bronze: DataFrame, avro: AvroSchemas | None) -> DataFrame:
    """Stage 1: each record's JSON text (`_text`) and the wire format's reason (`_wire`)."""
    if avro is None:
        return bronze.select(
            "*",
            F.col("value").cast("string").alias("_text"),
            F.lit(None).cast("string").alias("_wire"),
        )
    # Two projections: the decode runs once, then its text is judged.
    decoded = bronze.select("*", decoded_text(F.col("value"), avro).alias("_decoded"))
    wire = wire_reason(F.col("value"), F.col("_decoded"), avro)
    return decoded.select(
        *bronze.columns,
        F.when(wire.isNull(), F.col("_decoded")).alias("_text"),
        wire.alias("_wire"),
    )


def read_fields(records: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Stage 2: the parsed document (`_doc`), whether it is an object, and each declared
    field's variant (`_f<i>`)."""
    docs = records.select("*", F.try_parse_json("_text").alias("_doc"))
    return docs.select(
        "*",
        # A parsed document is an object iff its text opens with "{": far cheaper than
        # `schema_of_variant`, which walks the whole document to name its type.
        F.col("_text").rlike(r"^[ \t\n\r]*\{").alias("_is_object"),
        *[
            F.try_variant_get("_doc", _variant_path(path), "variant").alias(n)
            for path, _, n in _staged(pipeline)
        ],
    )


def typed_fields(read: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Stage 3: each field's value as its declared scalar (`_f<i>_value`), then its JSON
    type (`_f<i>_kind`) and, for a time, the parsed time (`_f<i>_time`)."""
    staged = _staged(pipeline)
    typed = read.select(
        "*", *[_extract(F.col(n), spec).alias(f"{n}_value") for _, spec, n in staged]
    )
    return typed.select(
        "*",
        *[_kind(F.col(n), F.col(f"{n}_value"), spec).alias(f"{n}_kind") for _, spec, n in staged],
        *[
            _as_time(F.col(f"{n}_value"), spec).alias(f"{n}_time")
            for _, spec, n in staged
            if spec.type in ("timestamp", "date")
        ],
    )


def quarantine_reason(pipeline: Pipeline, max_value_bytes: int, wire: bool) -> Column:
    """The first rule a staged record breaks (module docstring), null when it breaks none:
    the record-level rules, the wire format's (`wire`: an Avro pipeline), then each
    declared field's in the definition's order."""
    reason = F.when(F.col("value").isNull(), "null_value").when(
        F.length("value") > max_value_bytes, "oversized_value"
    )
    if wire:
        reason = reason.when(F.col("_wire").isNotNull(), F.col("_wire"))
    else:
        reason = reason.when(~F.is_valid_utf8("_text"), "invalid_utf8")
    reason = reason.when(F.col("_doc").isNull(), "invalid_json").when(
        ~F.col("_is_object"), "not_an_object"
    )
    for path, spec, n in _staged(pipeline):
        raw, kind, value = F.col(n), F.col(f"{n}_kind"), F.col(f"{n}_value")
        absent = raw.isNull() | F.is_variant_null(raw)
        if spec.required:
            reason = reason.when(absent, f"missing:{path}")
        reason = reason.when(~absent & ~_kind_ok(spec, kind), f"wrong_type:{path}")
        if spec.type in ("integer", "number"):
            reason = reason.when(~absent & _out_of_range(spec, value), f"out_of_range:{path}")
        if spec.type == "string" and not spec.allow_blank:
            reason = reason.when(~absent & _blank(value), f"blank:{path}")
        if spec.allowed is not None:
            allowed = F.array(*[F.lit(v) for v in spec.allowed])
            reason = reason.when(~absent & ~F.array_contains(allowed, value), f"not_allowed:{path}")
        if spec.type in ("timestamp", "date"):
            reason = reason.when(~absent & F.col(f"{n}_time").isNull(), f"unparseable_time:{path}")
        if path == pipeline.event_time:
            reason = reason.when(
                _out_of_bounds(F.col(f"{n}_time"), pipeline), f"out_of_bounds:{path}"
            )
    return reason


def _out_of_bounds(time: Column, pipeline: Pipeline) -> Column:
    """Does a parsed event time lie more than `event_time_bound_days` from the record's
    Kafka timestamp (bronze's `timestamp`), either way?

    The record's own timestamp, not the slice's interval: the rule stays per row, and a
    backfill of old events produced now has an old event time but a new timestamp,
    within the default bound. A date is compared as its midnight (UTC session). An
    Avro pipeline reaches this through the same field rules."""
    bound = F.expr(f"INTERVAL {pipeline.event_time_bound_days} DAYS")
    at, kafka = time.cast("timestamp"), F.col("timestamp")
    return (at < kafka - bound) | (at > kafka + bound)


def _out_of_range(spec: FieldSpec, value: Column) -> Column:
    """Can the declared type not hold a present value of the right JSON type?

    Only its extraction (`_f<i>_value`) is looked at, no second parse. An integer:
    the parse holds one past 64 bits as a decimal of up to 38 digits, an integral type
    (`_kind_ok`) that `try_variant_get` cannot make a bigint, so it gives null (past 38
    digits the parse holds a double, already a wrong type here). A number: the parse
    holds one past a double (1e400) as an infinity, which JSON cannot write otherwise.
    A time is not looked at here: past 64 bits or past any calendar, the parsed time
    is null, `unparseable_time`.

    An Avro pipeline reaches this through `avro.decoded_text` with no overflow of its
    own: an Avro int or long fits a bigint, a float or double is written as the same
    finite double (NaN and the infinities as strings: `wrong_type`). Only a `decimal`
    holding a whole number past 64 bits can exceed a bigint, and this rule catches it."""
    if spec.type == "integer":
        return value.isNull()
    return value.isNull() | value.isin(float("inf"), float("-inf"))


def declared_columns(pipeline: Pipeline) -> list[Column]:
    """Silver's declared columns of a staged record, then its `event_date`."""
    columns = {}
    for path, spec, n in _staged(pipeline):
        if spec.type in ("timestamp", "date"):
            column = F.col(f"{n}_time")
        elif spec.type in ("object", "array"):
            # A JSON null is no value, as for the other types (not the text "null").
            column = F.when(~F.is_variant_null(F.col(n)), F.col(f"{n}_value"))
        else:
            column = F.col(f"{n}_value")
        columns[path] = column
    return [
        *[column.alias(pipeline.column_of(path)) for path, column in columns.items()],
        F.to_date(columns[pipeline.event_time]).alias("event_date"),
    ]


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
