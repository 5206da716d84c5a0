"""Pure DataFrame -> DataFrame transforms from parsed bronze to silver, quarantine and gold.

They know the pipeline's shape (its key, survivor order, event time) only through
its definition (`slicewise.pipelines.Pipeline`); the parse itself is compiled
from the definition in `slicewise.contract`.
"""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from slicewise.contract import survivor_order
from slicewise.pipelines import Pipeline
from slicewise.schemas import KAFKA_POSITION, QUARANTINE, silver_schema, slice_ids_schema
from slicewise.tables import conform


def quarantined(parsed: DataFrame) -> DataFrame:
    """Records that broke the contract, raw bytes and coordinates kept for replay."""
    return conform(parsed.where(F.col("reason").isNotNull()), QUARANTINE)


def valid_events(parsed: DataFrame, pipeline: Pipeline) -> DataFrame:
    return conform(parsed.where(F.col("reason").isNull()), silver_schema(pipeline))


def survivors(events: DataFrame, pipeline: Pipeline) -> DataFrame:
    """One row per key, its surviving copy (`contract.survivor_order`), with `copies`:
    how many copies the slice held. One sort serves both, so silver gets its MERGE
    source and the slice's keys (`slice_ids`) from one pass."""
    by_key = Window.partitionBy(*pipeline.key_columns)
    return (
        events.withColumn("_rank", F.row_number().over(by_key.orderBy(*survivor_order(pipeline))))
        .withColumn("copies", F.count("*").over(by_key))
        .where("_rank = 1")
        .drop("_rank")
    )


def dedup_within(events: DataFrame, pipeline: Pipeline) -> DataFrame:
    """One row per key: the copy the survivor rule picks."""
    return survivors(events, pipeline).drop("copies")


def duplicated(rows: DataFrame, pipeline: Pipeline) -> DataFrame:
    """The rows of keys that have more than one, each with `beaten`: whether it is not
    its key's survivor (`contract.survivor_order`)."""
    by_key = Window.partitionBy(*pipeline.key_columns)
    return (
        rows.withColumn("_rank", F.row_number().over(by_key.orderBy(*survivor_order(pipeline))))
        .withColumn("_rows", F.count("*").over(by_key))
        .where("_rows > 1")
        .withColumn("beaten", F.col("_rank") > 1)
        .drop("_rank", "_rows")
    )


def kept_once(duplicates: DataFrame, pipeline: Pipeline, columns: list[str]) -> DataFrame:
    """From `duplicated`: the source of the MERGE that stores each key once
    (`silver.keep_one`): a `delete` row per distinct copy read, and a `keep` row, the
    key's survivor, each with `_seen`, the positions read of its key ("partition:offset")."""
    key = list(pipeline.key_columns)
    rows = duplicates.withColumn(
        "_seen",
        F.array_sort(
            F.collect_set(F.concat_ws(":", *KAFKA_POSITION)).over(Window.partitionBy(*key))
        ),
    )
    return (
        rows.dropDuplicates([*key, *KAFKA_POSITION])
        .withColumn("_op", F.lit("delete"))
        .unionByName(rows.where(~F.col("beaten")).withColumn("_op", F.lit("keep")))
        .select(*columns, "_op", "_seen")
    )


def slice_ids(kept: DataFrame, pipeline: Pipeline) -> DataFrame:
    """From `survivors`: one row per distinct key of a slice's valid events, how many
    copies the slice held and its surviving copy's event_date. What the gate and
    publish need of the slice, kept by silver so that neither parses the slice again."""
    return conform(kept, slice_ids_schema(pipeline))


def event_date_span(ids: DataFrame) -> DataFrame:
    """One row: the first and last event_date of a slice's events (nulls when it has none),
    its distinct event `dates` (sorted) and how many `rows` it has."""
    return ids.agg(
        F.min("event_date").alias("first"),
        F.max("event_date").alias("last"),
        F.sort_array(F.collect_set("event_date")).alias("dates"),
        F.count("*").alias("rows"),
    )


def horizon_ranges(dates: list[date], horizon_days: int) -> list[tuple[date, date]]:
    """Event dates a slice's MERGE may touch: each of its own dates widened by the dedup
    horizon, as the fewest disjoint ranges. A late event a year old adds its own date,
    not the year between it and today's."""
    ranges: list[tuple[date, date]] = []
    for d in sorted(dates):
        lo, hi = d - timedelta(days=horizon_days), d + timedelta(days=horizon_days)
        if ranges and lo <= ranges[-1][1] + timedelta(days=1):
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], hi))
        else:
            ranges.append((lo, hi))
    return ranges


def window_hours(window: tuple[date, date]) -> tuple[str, str]:
    """The first and last UTC hour of a window of event dates, as gold's `hour` strings.

    Event dates are UTC dates (the session zone is UTC), so this is plain formatting."""
    first, last = window
    return f"{first.isoformat()} 00:00:00", f"{last.isoformat()} 23:00:00"


def hours_sql(hours: list[tuple[str, str]]) -> str:
    """Gold's rows within ranges of hours, as a predicate (gold's replaceWhere)."""
    return " OR ".join(f"(hour >= '{first}' AND hour <= '{last}')" for first, last in hours)


def events_per_hour(
    silver: DataFrame, hours: list[tuple[str, str]], event_time: str, group_by: tuple[str, ...]
) -> DataFrame:
    """Gold: silver's events per UTC hour of their event time and the `group_by`
    columns, for the ranges of hours given."""
    return (
        silver.withColumn("hour", F.date_trunc("hour", event_time))
        .where(hours_sql(hours))
        .groupBy("hour", *group_by)
        .agg(F.count("*").alias("events"))
    )
