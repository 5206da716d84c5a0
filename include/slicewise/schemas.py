"""Every lakehouse table's schema: bronze and quarantine (fixed: Kafka's record), silver
and `slice_ids` (compiled from the pipeline's definition)."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
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

from slicewise.pipelines import Pipeline

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

QUARANTINE = StructType(
    [
        *[f for f in BRONZE.fields if f.name != "slice_id"],
        StructField("reason", StringType(), False),
        StructField("slice_id", StringType(), False),
    ]
)


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
KAFKA_POSITION = ("kafka_partition", "kafka_offset")


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
