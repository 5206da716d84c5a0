"""Rows the Spark tests build: bronze rows as the Kafka read would give them."""

from __future__ import annotations

from datetime import datetime, timezone

from pyspark.sql import DataFrame, SparkSession

from slicewise.schemas import BRONZE

TS = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)


def bronze_rows(
    spark: SparkSession,
    values: list[tuple[int, int, bytes | None]],
    topic: str = "events",
    at: datetime = TS,
) -> DataFrame:
    """Bronze rows of slice `s1`, one per (partition, offset, value), with Kafka
    timestamp `at` (default TS)."""
    rows = [(topic, p, o, at, 0, None, v, [], "s1") for p, o, v in values]
    return spark.createDataFrame(rows, BRONZE)
