"""Pure DataFrame -> DataFrame transforms from bronze to silver and quarantine.

The event contract (docs/EVENT_CONTRACT.md): a JSON object with `event_id`
(non-blank string), `event_type` (non-blank string), `occurred_at` (ISO-8601
with a zone) and optionally `payload` (object). Extra fields are allowed and
ignored; the raw record stays in bronze.
"""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from slicewise.tables import QUARANTINE, SILVER, SLICE_IDS, conform

# Optional fraction, mandatory zone ('Z' or +hh:mm): a timestamp without a zone
# is ambiguous, so it is quarantined rather than guessed.
OCCURRED_AT_FORMAT = "yyyy-MM-dd'T'HH:mm:ss[.SSSSSSSSS]XXX"

REASONS = (
    "null_value",
    "oversized_value",
    "invalid_utf8",
    "invalid_json",
    "not_an_object",
    "missing_event_id",
    "non_string_event_id",
    "blank_event_id",
    "invalid_event_type",
    "missing_occurred_at",
    "invalid_occurred_at",
    "invalid_payload",
)

# Survivor order among copies of one event_id: the lowest Kafka position.
SURVIVOR_ORDER = ("kafka_partition", "kafka_offset")
# The same order as a MERGE condition: source copy `s` is earlier than stored copy `t`.
EARLIER_SQL = (
    "s.kafka_partition < t.kafka_partition OR "
    "(s.kafka_partition = t.kafka_partition AND s.kafka_offset < t.kafka_offset)"
)


FIELDS = ("event_id", "event_type", "occurred_at", "payload")


def _blank(text: Column) -> Column:
    """Empty or only whitespace: Unicode White_Space, as the contract says (F.trim strips
    only spaces, so a tab-only id would pass for one)."""
    return text.rlike(r"(?U)^\s*$")


def _type_of(variant: Column) -> Column:
    return F.when(variant.isNull(), F.lit(None)).otherwise(F.schema_of_variant(variant))


def parse_events(bronze: DataFrame, max_value_bytes: int) -> DataFrame:
    """Bronze rows with the parsed event columns and a `reason` (null when valid).

    Built in stages (parse, read fields, judge), each a projection of its own, so a
    materialized result parses each document once: Spark keeps a projection apart
    from the next when merging them would repeat a costly expression. A filter on
    `reason` is still pushed below the stages and evaluated inline, re-parsing the
    document in each branch of the rules (~4x the cost on 500k records): filter a
    cached result (`silver.parsed_slice`).
    """
    text = F.col("value").cast("string")
    docs = bronze.select("*", F.try_parse_json(text).alias("_doc"))
    fields = docs.select(
        "*",
        F.schema_of_variant("_doc").alias("_doc_type"),
        *[F.try_variant_get("_doc", f"$.{name}", "variant").alias(f"_{name}") for name in FIELDS],
    )
    typed = fields.select(
        "*",
        *[_type_of(F.col(f"_{name}")).alias(f"_{name}_type") for name in FIELDS],
        *[
            F.try_variant_get(f"_{name}", "$", "string").alias(f"_{name}_str")
            for name in FIELDS[:3]
        ],
    )
    timed = typed.select(
        "*",
        F.try_to_timestamp("_occurred_at_str", F.lit(OCCURRED_AT_FORMAT)).alias("_occurred"),
    )

    def field(name: str) -> Column:
        return F.col(f"_{name}")

    def kind(name: str) -> Column:
        return F.col(f"_{name}_type")

    event_id, event_type = F.col("_event_id_str"), F.col("_event_type_str")
    occurred_at = F.col("_occurred")
    reason = (
        F.when(F.col("value").isNull(), "null_value")
        .when(F.length("value") > max_value_bytes, "oversized_value")
        .when(~F.is_valid_utf8(text), "invalid_utf8")
        .when(F.col("_doc").isNull(), "invalid_json")
        .when(~F.col("_doc_type").startswith("OBJECT"), "not_an_object")
        .when(field("event_id").isNull() | F.is_variant_null(field("event_id")), "missing_event_id")
        .when(kind("event_id") != "STRING", "non_string_event_id")
        .when(_blank(event_id), "blank_event_id")
        .when(
            (kind("event_type") != "STRING") | _blank(event_type) | field("event_type").isNull(),
            "invalid_event_type",
        )
        .when(
            field("occurred_at").isNull() | F.is_variant_null(field("occurred_at")),
            "missing_occurred_at",
        )
        .when((kind("occurred_at") != "STRING") | occurred_at.isNull(), "invalid_occurred_at")
        .when(
            field("payload").isNotNull()
            & ~F.coalesce(kind("payload").startswith("OBJECT"), F.lit(False)),
            "invalid_payload",
        )
    )
    return timed.select(
        *[F.col(c) for c in bronze.columns],
        event_id.alias("event_id"),
        event_type.alias("event_type"),
        occurred_at.alias("occurred_at"),
        F.to_date(occurred_at).alias("event_date"),
        F.to_json(field("payload")).alias("payload"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        reason.alias("reason"),
    )


def quarantined(parsed: DataFrame) -> DataFrame:
    """Records that broke the contract, raw bytes and coordinates kept for replay."""
    return conform(parsed.where(F.col("reason").isNotNull()), QUARANTINE)


def valid_events(parsed: DataFrame) -> DataFrame:
    return conform(parsed.where(F.col("reason").isNull()), SILVER)


def survivors(events: DataFrame) -> DataFrame:
    """One row per event_id, its surviving copy (the lowest Kafka position), with
    `copies`: how many copies the slice held. One sort serves both, so silver gets
    its MERGE source and the slice's ids (`slice_ids`) from one pass."""
    by_id = Window.partitionBy("event_id")
    return (
        events.withColumn("_rank", F.row_number().over(by_id.orderBy(*SURVIVOR_ORDER)))
        .withColumn("copies", F.count("*").over(by_id))
        .where("_rank = 1")
        .drop("_rank")
    )


def dedup_within(events: DataFrame) -> DataFrame:
    """One row per event_id: the copy at the lowest Kafka position survives."""
    return survivors(events).drop("copies")


def slice_ids(kept: DataFrame) -> DataFrame:
    """From `survivors`: one row per distinct event_id of a slice's valid events, how
    many copies the slice held and its surviving copy's event_date. What the gate and
    publish need of the slice, kept by silver so that neither parses the slice again."""
    return conform(kept, SLICE_IDS)


def event_date_span(ids: DataFrame) -> DataFrame:
    """One row: the first and last event_date of a slice's events (nulls when it has none)."""
    return ids.agg(F.min("event_date").alias("first"), F.max("event_date").alias("last"))


def horizon_window(first: date, last: date, horizon_days: int) -> tuple[date, date]:
    """Event dates a slice's MERGE may touch: its own dates widened by the dedup horizon."""
    return first - timedelta(days=horizon_days), last + timedelta(days=horizon_days)


def window_hours(window: tuple[date, date]) -> tuple[str, str]:
    """The first and last UTC hour of a window of event dates, as gold's `hour` strings.

    Event dates are UTC dates (the session zone is UTC), so this is plain formatting."""
    first, last = window
    return f"{first.isoformat()} 00:00:00", f"{last.isoformat()} 23:00:00"


def events_per_hour(silver: DataFrame, hours: tuple[str, str]) -> DataFrame:
    """Gold: silver's events per UTC hour and event type, for the hours given."""
    first, last = hours
    return (
        silver.withColumn("hour", F.date_trunc("hour", "occurred_at"))
        .where(F.col("hour").between(F.to_timestamp(F.lit(first)), F.to_timestamp(F.lit(last))))
        .groupBy("hour", "event_type")
        .agg(F.count("*").alias("events"))
    )
