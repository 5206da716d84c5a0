"""Schemas of the lakehouse tables, and small helpers shared by the steps."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
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

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))

BRONZE = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("timestamp", TimestampType(), True),
    StructField("timestamp_type", IntegerType(), True),
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("headers", HEADERS, True),
    StructField("slice_id", StringType(), False),
])

SILVER = StructType([
    StructField("event_id", StringType(), False),
    StructField("event_type", StringType(), False),
    StructField("occurred_at", TimestampType(), False),
    StructField("event_date", DateType(), False),
    StructField("payload", StringType(), True),
    StructField("kafka_partition", IntegerType(), False),
    StructField("kafka_offset", LongType(), False),
    StructField("kafka_timestamp", TimestampType(), True),
    StructField("slice_id", StringType(), False),
])

QUARANTINE = StructType([
    *[f for f in BRONZE.fields if f.name != "slice_id"],
    StructField("reason", StringType(), False),
    StructField("slice_id", StringType(), False),
])


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
