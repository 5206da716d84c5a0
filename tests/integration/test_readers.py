"""Silver read outside Spark, as users point other engines at it: delta-rs 1.6 reads a
silver whose MERGE replaced a row (a deletion vector) through its query engine, while its
pyarrow path refuses the feature (gold has none); with `deletion_vectors: false` in the definition, or
after the feature is dropped, that path reads it too. Each key once in every case."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from slicewise.gate import run_gate
from slicewise.home import REPO_ROOT
from slicewise.ingest import run_ingest
from slicewise.ledger import Ledger
from slicewise.planner import plan_slice
from slicewise.publish import run_publish
from slicewise.tables import delta_ref
from slicewise_dev.producer import Record, event_value

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(days=1)).replace(
    hour=0, minute=0, second=0, microsecond=0
)
HOUR = timedelta(hours=1)
LATER = datetime.now(timezone.utc) + timedelta(days=365)


def at(hours: float) -> datetime:
    return T0 + hours * HOUR


def silver_with_a_replacing_merge(spark, settings, producer) -> str:
    """Two slices; the second holds a copy of key `a` at a lower Kafka position than the
    stored one (partition 0 against 1), so its MERGE replaces the stored row."""
    producer.send(
        [
            Record(event_value("a", at(0.2)), 1, at(0.2)),
            Record(event_value("b", at(0.3)), 0, at(0.3)),
            Record(event_value("a", at(1.2)), 0, at(1.2)),
            Record(event_value("c", at(1.3)), 1, at(1.3)),
        ]
    )
    for hour in (0, 1):
        sl = plan_slice(settings, at(hour), at(hour + 1), now=LATER)
        run_ingest(spark, settings, sl.slice_id)
    path = settings.table("silver")
    [merge] = spark.sql(f"DESCRIBE HISTORY {delta_ref(path)} LIMIT 1").collect()
    assert merge.operation == "MERGE" and int(merge.operationMetrics["numTargetRowsUpdated"]) == 1
    return path


def keys_and_times(table) -> list[tuple[str, datetime]]:
    rows = pa.table(table).select(["event_id", "occurred_at"]).to_pylist()
    return sorted((r["event_id"], r["occurred_at"]) for r in rows)


EXPECTED = [("a", at(1.2)), ("b", at(0.3)), ("c", at(1.3))]


def test_delta_rs_reads_silver_with_deletion_vectors_through_its_query_engine(spark, pipeline):
    settings, producer = pipeline
    path = silver_with_a_replacing_merge(spark, settings, producer)
    silver = DeltaTable(path)
    assert "deletionVectors" in (silver.protocol().reader_features or [])

    queried = QueryBuilder().register("silver", silver).execute("SELECT * FROM silver").read_all()
    assert keys_and_times(queried) == EXPECTED
    with pytest.raises(Exception, match="deletionVectors"):
        silver.to_pyarrow_table()

    # Gold is rewritten by hour (replaceWhere), without deletion vectors: any reader reads it.
    for sl in Ledger.of(settings).latest_slices(2):
        run_gate(spark, settings, sl.slice_id)
        run_publish(spark, settings, sl.slice_id)
    gold = DeltaTable(settings.table("gold_events_per_hour"))
    assert "deletionVectors" not in (gold.protocol().reader_features or [])
    assert sum(pa.table(gold.to_pyarrow_table()).column("events").to_pylist()) == 3

    # What a team whose readers lack the feature does to an existing silver (docs/PIPELINES.md).
    spark.sql(f"ALTER TABLE {delta_ref(path)} DROP FEATURE deletionVectors").collect()
    dropped = DeltaTable(path)
    assert "deletionVectors" not in (dropped.protocol().reader_features or [])
    assert keys_and_times(dropped.to_pyarrow_table()) == EXPECTED


def test_a_definition_without_deletion_vectors_makes_silver_every_reader_reads(
    spark, pipeline_factory, tmp_path
):
    definitions = tmp_path / "pipelines.yaml"
    source = (REPO_ROOT / "pipelines.yaml").read_text()
    definitions.write_text(
        source.replace("  events:\n", "  events:\n    deletion_vectors: false\n", 1)
    )
    settings, producer = pipeline_factory(SLICEWISE_PIPELINES_FILE=str(definitions))
    path = silver_with_a_replacing_merge(spark, settings, producer)
    silver = DeltaTable(path)
    assert "deletionVectors" not in (silver.protocol().reader_features or [])
    assert keys_and_times(silver.to_pyarrow_table()) == EXPECTED
