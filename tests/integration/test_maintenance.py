"""Maintenance on real Delta tables: compaction of the settled event dates and of the
other tables, the purge of deletion vectors, bronze retention of published slices only,
and VACUUM freeing the rewritten files."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from slicewise import key_index
from slicewise import maintenance as maintenance_module
from slicewise.bronze import BronzeDropped
from slicewise.gate import run_gate
from slicewise.home import REPO_ROOT
from slicewise.ingest import run_ingest
from slicewise.ledger import BRONZE_DROPPED, Ledger
from slicewise.maintenance import run_maintenance
from slicewise.planner import plan_slice
from slicewise.publish import run_publish
from slicewise.tables import table_version
from slicewise_dev.producer import Record, event_value

pytestmark = pytest.mark.integration

# Four days back: every date is settled for a horizon of one day, and Kafka (7 days of
# time-based retention) still holds the records.
NOW = datetime.now(timezone.utc)
T0 = (NOW - timedelta(days=4)).replace(hour=0, minute=0, second=0, microsecond=0)
HOUR = timedelta(hours=1)
LATER = datetime.now(timezone.utc) + timedelta(days=365)
RETAIN = 20  # seconds: VACUUM's retention and the step timeout of this test


def definitions(tmp_path: Path) -> Path:
    """The default pipeline, with a one-day horizon, the highest `occurred_at` surviving
    (so a later copy replaces a stored row: a deletion vector), and short retentions."""
    doc = yaml.safe_load((REPO_ROOT / "pipelines.yaml").read_text())
    events = doc["pipelines"]["events"]
    events["horizon_days"] = 1
    events["survivor"] = {"order_by": "occurred_at", "keep": "highest"}
    events["maintenance"] = {"vacuum_retain": f"{RETAIN}s", "bronze_retain": "1d"}
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def events_at(hour: int, n: int) -> list[Record]:
    return [
        Record(
            event_value(f"h{hour}-{i}", T0 + hour * HOUR + i * timedelta(seconds=20)),
            i % 3,
            T0 + hour * HOUR + i * timedelta(seconds=20),
        )
        for i in range(n)
    ]


def dated_yesterday_and_today(hour: int) -> list[Record]:
    """Two events in the slice of `hour` whose event times are yesterday and today: the
    dates inside the horizon that live slices still write."""
    return [
        Record(event_value(f"h{hour}-{name}", at), 0, T0 + hour * HOUR + timedelta(minutes=30))
        for name, at in (("yesterday", NOW - timedelta(days=1)), ("today", NOW))
    ]


def through_gate(spark, settings, hour: int, publish: bool = True) -> str:
    sl = plan_slice(settings, T0 + hour * HOUR, T0 + (hour + 1) * HOUR, now=LATER)
    run_ingest(spark, settings, sl.slice_id)
    run_gate(spark, settings, sl.slice_id)
    if publish:
        run_publish(spark, settings, sl.slice_id)
    return sl.slice_id


def files_per_date(spark, settings) -> dict[str, int]:
    rows = (
        spark.read.format("delta")
        .load(settings.table("silver"))
        .select("event_date", F.input_file_name().alias("file"))
        .groupBy("event_date")
        .agg(F.countDistinct("file").alias("files"))
        .collect()
    )
    return {str(r.event_date): r.files for r in rows}


def parquet_on_disk(path: str) -> dict[Path, int]:
    return {p: p.stat().st_size for p in Path(path).rglob("*.parquet")}


def test_maintenance_compacts_purges_retains_and_vacuums(
    spark, pipeline_factory, tmp_path, monkeypatch
):
    settings, producer = pipeline_factory(
        SLICEWISE_PIPELINES_FILE=str(definitions(tmp_path)), SLICEWISE_STEP_TIMEOUT=f"{RETAIN}s"
    )
    day = T0.date().isoformat()
    yesterday, today = (NOW - timedelta(days=1)).date().isoformat(), NOW.date().isoformat()
    producer.send([r for h in range(3) for r in events_at(h, 30) + dated_yesterday_and_today(h)])
    published = [through_gate(spark, settings, h) for h in range(2)]
    unpublished = through_gate(spark, settings, 2, publish=False)
    # Each MERGE added a file to each date it wrote.
    assert files_per_date(spark, settings) == {day: 3, yesterday: 3, today: 3}

    # Bronze retention records before it deletes: cut off between the two (a killed
    # task), the ledger already says the rows are gone, steps refuse the slices, and the
    # next run deletes them. Bronze comes first, so only its compaction ran.
    real = maintenance_module.retry_on_conflict

    def cut_off(write, what):
        if what == "bronze retention":
            raise RuntimeError("cut off before bronze retention's DELETE")
        return real(write, what)

    with monkeypatch.context() as cut:
        cut.setattr(maintenance_module, "retry_on_conflict", cut_off)
        with pytest.raises(RuntimeError, match="cut off"):
            run_maintenance(spark, settings, now=NOW)
    ledger = Ledger.of(settings)
    assert all(ledger.step(s, BRONZE_DROPPED) for s in published)
    with pytest.raises(BronzeDropped, match="bronze_retain"):
        run_ingest(spark, settings, published[1])
    bronze = spark.read.format("delta").load(settings.table("bronze"))
    assert {r.slice_id for r in bronze.select("slice_id").distinct().collect()} == {
        *published,
        unpublished,
    }

    first = run_maintenance(spark, settings, now=NOW)
    first_ended = time.monotonic()
    by_table = {t.table: t for t in first.tables}
    assert set(by_table) == {
        "bronze", "silver", "quarantine", "slice_ids", "gold_events_per_hour", "key_index"
    }  # fmt: skip
    # The key index holds every slice recorded so far: the next slices look up there.
    assert by_table["key_index"].files_after >= 1
    indexed = key_index.covered(spark, settings)
    assert indexed == table_version(spark, settings.table("slice_ids"))
    # Every date but today's is compacted, yesterday's inside the horizon too.
    assert files_per_date(spark, settings) == {day: 1, yesterday: 1, today: 3}
    assert (first.compacted_before, first.settled_before) == (
        today,
        (NOW - timedelta(days=2)).date().isoformat(),
    )
    assert by_table["silver"].files_compacted >= 3
    bronze_history = spark.sql(f"DESCRIBE HISTORY delta.`{settings.table('bronze')}`")
    assert "OPTIMIZE" in {r.operation for r in bronze_history.collect()}
    # Bronze retention: the published slices' rows went, the unpublished one's stayed.
    assert by_table["bronze"].slices_dropped == published
    assert first.kept_unpublished == [unpublished]
    bronze = spark.read.format("delta").load(settings.table("bronze"))
    assert {r.slice_id for r in bronze.select("slice_id").distinct().collect()} == {unpublished}
    with pytest.raises(BronzeDropped, match="bronze_retain"):
        run_ingest(spark, settings, published[0])
    silver = spark.read.format("delta").load(settings.table("silver"))
    assert silver.count() == 96 and silver.select("event_id").distinct().count() == 96

    # A later copy of h0-0, dated the next day: the MERGE marks the stored row deleted
    # in the one compacted file of the first day (a deletion vector), and adds no file
    # to that date, so compaction leaves the file alone and only the purge rewrites it.
    later = T0 + timedelta(days=1, hours=3)
    producer.send([Record(event_value("h0-0", later), 0, T0 + 3 * HOUR + timedelta(minutes=5))])
    through_gate(spark, settings, 3)
    assert files_per_date(spark, settings)[day] == 1
    on_disk_before = parquet_on_disk(settings.table("silver"))

    # The files the first run rewrote must be past the retention: wait only for what the
    # slice above did not already take.
    time.sleep(max(0.0, first_ended + RETAIN + 1 - time.monotonic()))
    second = run_maintenance(spark, settings, now=NOW)
    silver_upkeep = next(t for t in second.tables if t.table == "silver")
    # The slice since then was added as a run of its own, not by a rebuild.
    assert key_index.covered(spark, settings) > indexed
    assert next(t for t in second.tables if t.table == "key_index").files_compacted == 0
    assert silver_upkeep.deletion_vectors_purged == 1
    assert silver_upkeep.files_vacuumed >= by_table["silver"].files_compacted
    assert silver_upkeep.bytes_vacuumed > 0
    # What VACUUM reports is what left the disk, file for file, byte for byte.
    gone = on_disk_before.keys() - parquet_on_disk(settings.table("silver")).keys()
    assert len(gone) == silver_upkeep.files_vacuumed
    assert sum(on_disk_before[p] for p in gone) == silver_upkeep.bytes_vacuumed
    silver = spark.read.format("delta").load(settings.table("silver"))
    rows = {r.event_id: r for r in silver.collect()}
    assert len(rows) == 96 and rows["h0-0"].occurred_at.replace(tzinfo=timezone.utc) == later
    details = spark.sql(f"DESCRIBE DETAIL delta.`{settings.table('silver')}`").first()
    assert details["properties"]["delta.deletedFileRetentionDuration"] == (
        f"interval {RETAIN} seconds"
    )


def test_a_slice_ingested_again_once_its_write_ids_are_forgotten_appends_nothing_twice(
    spark, pipeline_factory, new_topic, tmp_path, monkeypatch
):
    """Maintenance keeps Delta's idempotent-write ids only as long as `vacuum_retain`
    (20 s here), so a table's state stays as small as its recent slices' ids. A slice
    ingested again after that (a cleared task days later) finds its rows, not its ids:
    bronze, quarantine and `slice_ids` keep one copy, and its gate still passes. The
    control, a second lakehouse whose steps trust the ids alone, appends every table's
    rows again: the ids really were forgotten."""
    import slicewise.bronze as bronze_module
    import slicewise.silver as silver_module

    topic = new_topic(3)
    env = {"SLICEWISE_PIPELINES_FILE": str(definitions(tmp_path)), "SLICEWISE_STEP_TIMEOUT": "20s"}
    settings, producer = pipeline_factory(topic=topic, **env)
    control, _ = pipeline_factory(topic=topic, **env)
    producer.send([*events_at(0, 12), Record(b"{not json", 1, T0 + timedelta(minutes=30))])
    tables = ("bronze", "quarantine", "slice_ids")

    def rows(s) -> dict[str, int]:
        return {t: spark.read.format("delta").load(s.table(t)).count() for t in tables}

    slice_id = through_gate(spark, settings, 0, publish=False)
    through_gate(spark, control, 0, publish=False)
    assert rows(settings) == rows(control) == {"bronze": 13, "quarantine": 1, "slice_ids": 12}
    run_maintenance(spark, settings, now=NOW)
    for t in tables:
        spark.sql(
            f"ALTER TABLE delta.`{control.table(t)}` SET TBLPROPERTIES "
            f"('delta.setTransactionRetentionDuration' = 'interval {RETAIN} seconds')"
        ).collect()
    time.sleep(RETAIN + 1)

    with monkeypatch.context() as trusting:
        for module in (bronze_module, silver_module):
            trusting.setattr(module, "ids_may_be_forgotten", lambda *_: False)
        run_ingest(spark, control, slice_id)
    assert rows(control) == {"bronze": 26, "quarantine": 2, "slice_ids": 24}

    run_ingest(spark, settings, slice_id)
    assert rows(settings) == {"bronze": 13, "quarantine": 1, "slice_ids": 12}
    assert run_gate(spark, settings, slice_id)["success"]
