"""Ingest (bronze and silver from one Kafka read) against a real broker, real Spark and
real Delta tables: the same tables as the two steps, and exactly once through a retry
after its bronze commit, a racing attempt, and records Kafka deleted meanwhile."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from test_core import LATER, at, ev, race, snapshot, table

from slicewise.bronze import run_bronze
from slicewise.faults import InjectedFault
from slicewise.gate_facts import slice_counts
from slicewise.ingest import run_ingest
from slicewise.ledger import Ledger
from slicewise.planner import plan_slice
from slicewise.silver import run_silver
from slicewise_dev.producer import Record

pytestmark = pytest.mark.integration


def messy_hour(producer) -> None:
    """Duplicates across partitions, a wrong type, bad JSON and a null value."""
    producer.send(
        [
            *[ev(f"i-{n}", 0.1 + n / 100, n % 3) for n in range(12)],
            ev("i-1", 0.5, 2),
            ev("i-2", 0.6, 0),
            ev("w", 0.7, 1, event_type=42),
            Record(b"{oops", 0, at(0.8)),
            Record(None, 1, at(0.9)),
        ]
    )


def test_ingest_ends_in_the_tables_bronze_then_silver_would(spark, pipeline_factory):
    """The same stream through ingest and through the two steps: row for row the same."""
    one, producer = pipeline_factory()
    messy_hour(producer)
    two, _ = pipeline_factory(topic=one.topic)
    sl = plan_slice(one, at(0), at(1), now=LATER)
    assert plan_slice(two, at(0), at(1), now=LATER).ranges == sl.ranges

    result = run_ingest(spark, one, sl.slice_id)
    assert (result.bronze.rows, result.bronze.committed) == (17, True)
    run_bronze(spark, two, sl.slice_id)
    run_silver(spark, two, sl.slice_id)

    assert snapshot(spark, one) == snapshot(spark, two)
    copies = {r.event_id: r.copies for r in table(spark, one, "slice_ids").collect()}
    assert copies == {f"i-{n}": 2 if n in (1, 2) else 1 for n in range(12)}
    counts = slice_counts(spark, one, sl.slice_id)
    assert counts == slice_counts(spark, two, sl.slice_id)
    assert (counts.read, counts.quarantined, counts.duplicates_in_slice, counts.inserted) == (
        17,
        3,
        2,
        12,
    )
    ledger = Ledger(one.ledger_dir, one.topic)
    assert ledger.step(sl.slice_id, "bronze")["rows"] == 17
    assert ledger.step(sl.slice_id, "silver")["window"] is not None


def test_a_retry_after_the_bronze_commit_reads_bronze_not_kafka(
    spark, pipeline, kafka_bootstrap, monkeypatch
):
    """Killed between its bronze commit and its silver commit; by the retry, Kafka has
    deleted the slice's records. The retry finds the slice in bronze and ends exactly
    as one clean run would."""
    settings, producer = pipeline
    messy_hour(producer)
    sl = plan_slice(settings, at(0), at(1), now=LATER)
    monkeypatch.setenv("SLICEWISE_FAULTS", "bronze.committed")
    with pytest.raises(InjectedFault):
        run_ingest(spark, settings, sl.slice_id)
    assert table(spark, settings, "bronze").count() == 17
    assert Ledger.of(settings).step(sl.slice_id, "silver") is None

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    gone = [TopicPartition(settings.topic, p, until) for p, (_, until) in sl.ranges.items()]
    for future in admin.delete_records(gone).values():
        future.result(30)
    again = run_ingest(spark, settings, sl.slice_id)  # no data-loss override needed
    assert (again.bronze.rows, again.bronze.committed) == (17, False)
    assert Ledger.of(settings).step(sl.slice_id, "data_loss_ack") is None
    silver = sorted(r.event_id for r in table(spark, settings, "silver").collect())
    assert silver == sorted(f"i-{n}" for n in range(12))
    assert table(spark, settings, "quarantine").count() == 3
    assert slice_counts(spark, settings, sl.slice_id).reconciles


def test_a_rerun_of_ingest_changes_nothing(spark, pipeline):
    settings, producer = pipeline
    messy_hour(producer)
    sl = plan_slice(settings, at(0), at(1), now=LATER)
    run_ingest(spark, settings, sl.slice_id)
    before = snapshot(spark, settings)
    assert run_ingest(spark, settings, sl.slice_id).bronze.committed is False
    run_silver(spark, settings, sl.slice_id)  # silver alone, as on-call may
    assert snapshot(spark, settings) == before


def test_two_attempts_of_ingest_at_once_commit_once(spark, spark_remote, pipeline):
    """A zombie ingest and its retry, as two client sessions of one server."""
    settings, producer = pipeline
    producer.send([ev(f"z-{n}", 0.1 + n / 1000, n % 3) for n in range(300)])
    sl = plan_slice(settings, at(0), at(1), now=LATER)
    results = race(spark_remote, settings, run_ingest, sl.slice_id)
    # At most one attempt commits bronze. The winner may report False too: when its
    # silver MERGE loses a conflict to the other attempt, the whole step retries and
    # then finds bronze holding the slice. The rows below prove the single commit.
    assert sum(r.bronze.committed for r in results) <= 1
    bronze, silver = table(spark, settings, "bronze"), table(spark, settings, "silver")
    assert bronze.count() == 300 == bronze.select("partition", "offset").distinct().count()
    assert silver.count() == 300 == silver.select("event_id").distinct().count()
    assert slice_counts(spark, settings, sl.slice_id).reconciles


def test_a_slice_read_in_small_tasks_ends_as_one_read_per_partition(spark, pipeline_factory):
    """`SLICEWISE_RECORDS_PER_TASK` splits each partition's range into tasks; split ends
    fall inside transactions, aborted ones and their markers included."""
    whole, producer = pipeline_factory(SLICEWISE_RECORDS_PER_TASK="0")
    for n in range(4):
        producer.send([ev(f"c{n}-{i}", 0.1 + n / 10 + i / 1000, i % 3) for i in range(7)])
        producer.send([ev(f"a{n}-{i}", 0.15 + n / 10, i % 3) for i in range(5)], commit=False)
    producer.send([ev("c0-1", 0.9, 2), Record(b"{oops", 1, at(0.95))])
    split, _ = pipeline_factory(topic=whole.topic, SLICEWISE_RECORDS_PER_TASK="2")
    assert (whole.records_per_task, split.records_per_task) == (0, 2)
    sl = plan_slice(whole, at(0), at(1), now=LATER)
    assert plan_slice(split, at(0), at(1), now=LATER).ranges == sl.ranges

    run_ingest(spark, whole, sl.slice_id)
    run_ingest(spark, split, sl.slice_id)
    assert snapshot(spark, split) == snapshot(spark, whole)
    silver = sorted(r.event_id for r in table(spark, split, "silver").collect())
    assert silver == sorted(f"c{n}-{i}" for n in range(4) for i in range(7))
    assert table(spark, split, "bronze").count() == 30
