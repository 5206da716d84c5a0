"""A slice's window of silver: the event dates its MERGE may touch, and silver's rows there.

The window is the slice's own event dates (from its recorded `slice_ids`) widened by
the dedup horizon; the MERGE looked at no other partition, so the gate proves and
publish rebuilds only within it, at a cost that follows the slice, not silver.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from slicewise.config import Settings
from slicewise.schemas import silver_schema, slice_ids_schema
from slicewise.tables import of_slice, read_table
from slicewise.transforms import event_date_span, horizon_window

Window = tuple[date, date]


def recorded_ids(spark: SparkSession, settings: Settings, slice_id: str) -> DataFrame:
    """The slice's valid keys as silver recorded them (`slice_ids`)."""
    return of_slice(
        spark, settings.table("slice_ids"), slice_ids_schema(settings.pipeline), slice_id
    )


def slice_window(spark: SparkSession, settings: Settings, slice_id: str) -> Window | None:
    """Event dates the slice's MERGE may touch (its dates widened by the dedup horizon),
    or None when it has no valid event."""
    return window_of(event_date_span(recorded_ids(spark, settings, slice_id)).first(), settings)


def window_of(span: Row | None, settings: Settings) -> Window | None:
    """The horizon window of a span's `first` and `last` event dates; None without one."""
    if span is None or span["first"] is None:
        return None
    return horizon_window(span["first"], span["last"], settings.dedup_horizon_days)


def silver_window(
    spark: SparkSession, settings: Settings, window: Window | None, version: int | None = None
) -> DataFrame:
    """Silver rows within a window of event dates (partition-pruned); as of `version`
    when given (publication reads the version it proved verified)."""
    path, schema = settings.table("silver"), silver_schema(settings.pipeline)
    if version is None:
        silver = read_table(spark, path, schema)
    else:
        silver = spark.read.format("delta").option("versionAsOf", version).load(path)
    if window is None:
        return silver.limit(0)
    lo, hi = window
    return silver.where(F.col("event_date").between(F.lit(lo), F.lit(hi)))
