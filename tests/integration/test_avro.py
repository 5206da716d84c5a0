"""An Avro pipeline: records in the Confluent wire format, schemas from a real registry
(Apicurio), decoded in Spark by each record's writer schema into the reader schema's
columns, with the wire format's faults quarantined by name."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql import functions as F

from slicewise.ingest import run_ingest
from slicewise.planner import plan_slice
from slicewise_dev.producer import Record, avro_value

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
HOUR = timedelta(hours=1)
LATER = datetime.now(timezone.utc) + timedelta(days=1)

V1 = {
    "type": "record",
    "name": "Event",
    "namespace": "slicewise.test",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "event_type", "type": "string"},
        {"name": "occurred_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
# A compatible evolution: a new optional field with a default.
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "channel", "type": ["null", "string"], "default": None}],
}
# What a reader pinned to V2 cannot read: event_type became a number.
V3 = {
    **V1,
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "event_type", "type": "long"},
        {"name": "occurred_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}

DEFINITION = """\
pipelines:
  events:
    topic: events
    format: avro
    schema_registry: {version: 2}
    key: [event_id]
    event_time: occurred_at
    fields:
      event_id: {type: string, required: true}
      event_type: {type: string, required: true, allowed: [click, view]}
      occurred_at: {type: timestamp, required: true}
      channel: {type: string}
"""


def millis(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def test_avro_records_of_two_schema_versions_land_in_silver_and_faults_in_quarantine(
    spark, pipeline_factory, schema_registry, tmp_path
):
    definitions = tmp_path / "pipelines.yaml"
    definitions.write_text(DEFINITION)
    settings, producer = pipeline_factory(
        SLICEWISE_PIPELINES_FILE=str(definitions),
        SLICEWISE_SCHEMA_REGISTRY_URL=schema_registry.url,
    )
    subject = settings.schema_subject
    assert subject == f"{settings.topic}-value"
    v1 = schema_registry.register(subject, V1)
    v2 = schema_registry.register(subject, V2)
    schema_registry.set_compatibility(subject, "NONE")  # let the breaking V3 in
    v3 = schema_registry.register(subject, V3)
    assert len({v1, v2, v3}) == 3

    at = T0 + 0.5 * HOUR

    def rec(value: bytes | None, partition: int = 0) -> Record:
        return Record(value, partition, at)

    base = {"event_type": "click", "occurred_at": millis(at)}
    good = [rec(avro_value(v1, V1, {**base, "event_id": f"e{i}"}), i % 3) for i in range(6)] + [
        rec(avro_value(v2, V2, {**base, "event_id": f"f{i}", "channel": "web"}), i % 3)
        for i in range(4)
    ]
    # A re-sent copy, written with the newer schema: one survivor per key.
    good.append(rec(avro_value(v2, V2, {**base, "event_id": "e0", "channel": "app"}), 2))
    faults = {
        "not_wire_format": rec(b'{"event_id": "json"}'),
        "unknown_schema_id": rec(avro_value(v1 + 1000, V1, {**base, "event_id": "u"})),
        "undecodable": rec(b"\x00" + v1.to_bytes(4, "big") + b"\x02"),
        "unreadable_schema": rec(avro_value(v3, V3, {**base, "event_type": 7, "event_id": "w"})),
        "not_allowed:event_type": rec(
            avro_value(v1, V1, {**base, "event_type": "buy", "event_id": "n"})
        ),
        "null_value": rec(None),
    }
    producer.send([*good, *faults.values()])

    sl = plan_slice(settings, T0, T0 + HOUR, now=LATER)
    run_ingest(spark, settings, sl.slice_id)

    silver = spark.read.format("delta").load(settings.table("silver"))
    rows = {r.event_id: r for r in silver.collect()}
    assert sorted(rows) == sorted([f"e{i}" for i in range(6)] + [f"f{i}" for i in range(4)])
    assert rows["e0"].channel is None  # the first copy (partition 0) survives
    assert rows["f1"].channel == "web" and rows["e3"].channel is None
    assert {r.occurred_at.astimezone(timezone.utc) for r in rows.values()} == {at}
    assert {r.event_type for r in rows.values()} == {"click"}

    quarantine = spark.read.format("delta").load(settings.table("quarantine"))
    reasons = sorted(r.reason for r in quarantine.select("reason").collect())
    assert reasons == sorted(faults), reasons
    # Bronze holds every record as it came, bytes and all.
    bronze = spark.read.format("delta").load(settings.table("bronze"))
    assert bronze.count() == len(good) + len(faults)
    assert bronze.where(F.col("value").isNull()).count() == 1
