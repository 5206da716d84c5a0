"""Schemas of the lakehouse tables, and small helpers shared by the steps."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)

BRONZE = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), True),
        StructField("timestamp_type", IntegerType(), True),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", HEADERS, True),
        StructField("slice_id", StringType(), False),
    ]
)

SILVER = StructType(
    [
        StructField("event_id", StringType(), False),
        StructField("event_type", StringType(), False),
        StructField("occurred_at", TimestampType(), False),
        StructField("event_date", DateType(), False),
        StructField("payload", StringType(), True),
        StructField("kafka_partition", IntegerType(), False),
        StructField("kafka_offset", LongType(), False),
        StructField("kafka_timestamp", TimestampType(), True),
        StructField("slice_id", StringType(), False),
    ]
)

QUARANTINE = StructType(
    [
        *[f for f in BRONZE.fields if f.name != "slice_id"],
        StructField("reason", StringType(), False),
        StructField("slice_id", StringType(), False),
    ]
)


def table_exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, path)


def read_table(spark: SparkSession, path: str, schema: StructType) -> DataFrame:
    """The table, or an empty frame of its schema when nothing was written yet."""
    if table_exists(spark, path):
        return spark.read.format("delta").load(path)
    return spark.createDataFrame([], schema)


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """Select the schema's columns in order, cast to their types."""
    return df.select([df[f.name].cast(f.dataType).alias(f.name) for f in schema.fields])


def committed_by(spark: SparkSession, path: str, attempt: str, recent: int = 50) -> bool:
    """True if one of the table's last `recent` commits carries `attempt` in its
    userMetadata: a write with an idempotent-write id whose version was already
    committed returns normally without committing anything."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, path).history(recent)
    return history.where(F.col("userMetadata").contains(attempt)).limit(1).count() > 0


def retry_on_conflict(step: Callable[[], T], what: str, attempts: int = 3) -> T:
    """Run a step that is idempotent per slice, again if a concurrent writer won.

    Two attempts of one slice (a zombie driver and its retry) race on the same
    Delta commit; Delta lets exactly one win. The loser re-runs the step, which
    then finds the winner's commit (same idempotent-write id) and does nothing.
    """
    import delta.exceptions as dx

    # Not all of these share a Python base class (ProtocolChangedException does not).
    conflicts = (
        dx.DeltaConcurrentModificationException,
        dx.ConcurrentWriteException,
        dx.ConcurrentAppendException,
        dx.ConcurrentTransactionException,
        dx.MetadataChangedException,
        dx.ProtocolChangedException,
    )
    for attempt in range(1, attempts + 1):
        try:
            return step()
        except conflicts as exc:
            if attempt == attempts:
                raise
            log.warning(
                "%s lost a commit race (%s); re-checking (attempt %d)",
                what,
                type(exc).__name__,
                attempt + 1,
            )
    raise AssertionError("unreachable")
