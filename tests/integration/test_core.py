"""The exactly-once core against a real broker, real Spark and real Delta tables."""

from __future__ import annotations

import json
import shutil
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from slicewise import cli
from slicewise import silver as silver_module
from slicewise.bronze import run_bronze
from slicewise.gate_facts import slice_counts
from slicewise.ingest import run_ingest
from slicewise.kafka.offsets import TopicOffsets
from slicewise.ledger import Ledger
from slicewise.pipelines import load_pipelines
from slicewise.planner import IntervalNotClosed, StuckTransaction, plan_slice
from slicewise.schemas import silver_schema
from slicewise.silver import run_silver
from slicewise.slices import DataLossError
from slicewise.spark import remote_session
from slicewise.tables import append_once, delta_ref, table_properties
from slicewise.windows import Reach
from slicewise_dev.producer import Record, TxProducer, event_value

pytestmark = pytest.mark.integration

# Recent timestamps: Kafka's time-based retention (7 days by default) would
# otherwise delete the test records as soon as the broker looks at them.
T0 = (datetime.now(timezone.utc) - timedelta(days=2)).replace(
    hour=0, minute=0, second=0, microsecond=0
)
HOUR = timedelta(hours=1)
LATER = datetime.now(timezone.utc) + timedelta(
    days=365
)  # "now" for planning: every test interval has closed


def cli_env(monkeypatch, settings, kafka_bootstrap) -> None:
    """The environment a `slicewise` command of this pipeline reads its settings from."""
    for name, value in {
        "SLICEWISE_TOPIC": settings.topic,
        "SLICEWISE_LAKEHOUSE": settings.lakehouse,
        "SLICEWISE_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }.items():
        monkeypatch.setenv(name, value)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def ev(event_id, hours: float, partition: int = 0, **kw) -> Record:
    return Record(event_value(event_id, at(hours), **kw), partition, at(hours))


def table(spark, settings, name):
    return spark.read.format("delta").load(settings.table(name))


def run_slice(spark, settings, start: float, end: float):
    """Plan, then the DAG's `ingest` (bronze and silver from one read)."""
    sl = plan_slice(settings, at(start), at(end), now=LATER)
    run_ingest(spark, settings, sl.slice_id)
    return sl, slice_counts(spark, settings, sl.slice_id)  # as the gate counts


def test_interval_not_closed_is_refused(pipeline):
    settings, _ = pipeline
    with pytest.raises(IntervalNotClosed, match="closes at"):
        plan_slice(settings, at(0), at(1), now=at(1))


def test_contiguous_slices_with_out_of_order_timestamps_and_idle_partitions(spark, pipeline):
    settings, producer = pipeline
    # Partition 0 gets timestamps out of order, partition 1 only late in the day, partition 2 none.
    hours_p0 = [0.5, 2.5, 0.2, 4.9, 3.1, 1.0, 5.5, 0.1, 2.0]
    producer.send([ev(f"p0-{i}", h, 0) for i, h in enumerate(hours_p0)])
    producer.send([ev(f"p1-{i}", 4 + i / 10, 1) for i in range(4)])
    order = [3, 0, 5, 1, 4, 2]  # intervals planned out of order, like a backfill
    slices = {i: plan_slice(settings, at(i), at(i + 1), now=LATER) for i in order}
    ledger = Ledger.of(settings)
    first, last = ledger.boundary(at(0)), ledger.boundary(at(6))
    for p in (0, 1, 2):
        owned = [o for i in range(6) for o in range(*slices[i].ranges.get(p, (0, 0)))]
        assert owned == list(range(first.offset(p), last.offset(p))), (
            f"partition {p} not contiguous"
        )
    # Re-planning returns the frozen slices unchanged.
    assert all(plan_slice(settings, at(i), at(i + 1), now=LATER) == slices[i] for i in range(6))
    for i in order:
        run_bronze(spark, settings, slices[i].slice_id)
    bronze = table(spark, settings, "bronze")
    assert bronze.count() == bronze.select("partition", "offset").distinct().count()


def test_retention_gap_fails_with_data_loss_report_and_override_works(
    spark, pipeline, kafka_bootstrap
):
    settings, producer = pipeline
    producer.send([ev(f"r-{i}", 0.1 + i / 100, 0) for i in range(10)])
    sl = plan_slice(settings, at(0), at(1), now=LATER)
    frm, until = sl.ranges[0]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_records([TopicPartition(settings.topic, 0, frm + 4)])[
        TopicPartition(settings.topic, 0, frm + 4)
    ].result(30)
    assert TopicOffsets.of(settings).earliest([0])[0] == frm + 4

    with pytest.raises(DataLossError) as lost:
        run_bronze(spark, settings, sl.slice_id)
    assert f"partition 0: offsets [{frm}, {frm + 4}) are gone (4 offsets)" in str(lost.value)
    assert not table_exists(spark, settings, "bronze")

    run_bronze(spark, settings, sl.slice_id, accept_data_loss=True)
    assert table(spark, settings, "bronze").count() == 6
    ack = Ledger.of(settings).step(sl.slice_id, "data_loss_ack")
    assert ack["losses"] == [{"partition": 0, "missing_from": frm, "missing_until": frm + 4}]


def test_a_backfill_older_than_retention_fails_planning_until_the_data_loss_override(
    spark, pipeline, kafka_bootstrap, monkeypatch, capsys
):
    settings, producer = pipeline
    ledger = Ledger.of(settings)
    producer.send([ev(f"old-{i}", 0.1 + i / 10, 0) for i in range(3)])  # hour 0: offsets 0-2
    producer.send([ev(f"new-{i}", 3.1 + i / 10, 0) for i in range(3)])
    producer.send([ev(f"p1-{i}", 0.2 + i / 10, 1) for i in range(3)])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for tp in (TopicPartition(settings.topic, 0, 2), TopicPartition(settings.topic, 1, 1)):
        admin.delete_records([tp])[tp].result(30)  # retention, before anything was planned

    # Hour 2's deleted neighbours are older than what p0 still retains (an hour-0 record):
    # nothing of hour 2 can be gone, and its slice is frozen as usual.
    plan_slice(settings, at(2), at(3), now=LATER)
    # Hour 0 was never planned, and p0 and p1 now start after its start: offsets 0-1 of p0
    # and 0 of p1 may have been its records. Refused, naming them, and nothing is frozen.
    with pytest.raises(DataLossError) as lost:
        plan_slice(settings, at(0), at(1), now=LATER)
    assert "before the interval" in str(lost.value)
    assert "partition 0: offsets [0, 2) are gone (2 offsets)" in str(lost.value)
    assert "partition 1: offsets [0, 1) are gone (1 offsets)" in str(lost.value)
    assert ledger.boundary(at(0)) is None
    # By hand, `slicewise plan` prints the report and its safe action, not a traceback.
    cli_env(monkeypatch, settings, kafka_bootstrap)
    assert cli.main(["plan", "--start", at(0).isoformat(), "--end", at(1).isoformat()]) == 1
    printed = capsys.readouterr().err
    assert "DataLossError: " in printed and "--accept-data-loss" in printed, printed
    assert "Traceback" not in printed
    with pytest.raises(DataLossError):  # --debug: the traceback too
        cli.main(["--debug", "plan", "--start", at(0).isoformat(), "--end", at(1).isoformat()])
    assert ledger.boundary(at(0)) is None

    sl = plan_slice(settings, at(0), at(1), now=LATER, accept_data_loss=True)
    assert sl.ranges[0][0] == 2 and sl.ranges[1][0] == 1  # from what is retained
    ack = ledger.step(sl.slice_id, "data_loss_ack")
    assert ack["found_by"] == "plan" and ack["losses"] == [
        {"partition": 0, "missing_from": 0, "missing_until": 2},
        {"partition": 1, "missing_from": 0, "missing_until": 1},
    ]
    assert plan_slice(settings, at(0), at(1), now=LATER) == sl  # frozen: no second report
    # ... and the run goes on with what Kafka still retains of the hour.
    run_bronze(spark, settings, sl.slice_id)
    run_silver(spark, settings, sl.slice_id)
    ids = sorted(r.event_id for r in table(spark, settings, "silver").collect())
    assert ids == ["old-2", "p1-1", "p1-2"]


def table_exists(spark, settings, name):
    from slicewise.tables import table_exists as exists

    return exists(spark, settings.table(name))


def snapshot(spark, settings):
    return {
        name: sorted(map(tuple, table(spark, settings, name).collect()), key=repr)
        for name in ("bronze", "silver", "quarantine")
    }


def test_rerun_of_bronze_and_silver_leaves_tables_unchanged(spark, pipeline):
    settings, producer = pipeline
    producer.send([ev("a", 0.1, 0), ev("b", 0.2, 1), ev("a", 0.3, 2), Record(b"{oops", 0, at(0.4))])
    sl, counts = run_slice(spark, settings, 0, 1)
    before = snapshot(spark, settings)
    again = run_bronze(spark, settings, sl.slice_id)
    assert again.committed is False
    run_silver(spark, settings, sl.slice_id)
    assert slice_counts(spark, settings, sl.slice_id) == counts
    assert snapshot(spark, settings) == before


def test_a_silver_whose_first_commit_was_cut_off_is_created_by_the_retry(spark, pipeline):
    """A Spark Connect server killed while silver was being created left
    `_delta_log/_staged_commits/` and no commit (seen in the chaos suite). SQL takes
    such a folder for a table, so CREATE TABLE IF NOT EXISTS did nothing and every
    retry's MERGE failed with DELTA_TABLE_NOT_FOUND; the retry must create silver."""
    settings, producer = pipeline
    producer.send([ev("a", 0.1, 0), ev("b", 0.2, 1), ev("a", 0.3, 2)])
    sl = plan_slice(settings, at(0), at(1), now=LATER)
    run_bronze(spark, settings, sl.slice_id)
    (Path(settings.table("silver")) / "_delta_log" / "_staged_commits").mkdir(parents=True)
    assert table_properties(spark, settings.table("silver")) is None  # no table there yet

    run_silver(spark, settings, sl.slice_id)
    silver = table(spark, settings, "silver")
    assert sorted(r.event_id for r in silver.select("event_id").collect()) == ["a", "b"]
    detail = spark.sql(f"DESCRIBE DETAIL {delta_ref(settings.table('silver'))}").first()
    assert detail["properties"]["delta.enableDeletionVectors"] == "true"
    assert detail["partitionColumns"] == ["event_date"]
    assert all(f.nullable for f in silver.schema.fields)  # as a table made by SQL's DDL
    assert slice_counts(spark, settings, sl.slice_id).reconciles


def test_duplicates_aborted_and_open_transactions(spark, pipeline, kafka_bootstrap):
    settings, producer = pipeline
    producer.send([ev("x1", 0.1, 0), ev("x2", 0.2, 0), ev("x1", 0.3, 0)])  # dup within a partition
    producer.send([ev("x2", 0.4, 1), ev("x3", 0.5, 2)])  # dup across partitions
    producer.send([ev("aborted-1", 0.6, 0), ev("aborted-2", 0.7, 1)], commit=False)
    producer.send([ev("x3", 1.5, 1), ev("x4", 1.6, 0)])  # dup across slices, hours later
    # Open for two slices: longer than the producer's default 60 s on a loaded host, when
    # the coordinator aborted it and its commit failed as fenced (fresh-clone CI, 2026-12-01).
    hung = TxProducer(
        {"bootstrap.servers": kafka_bootstrap, "transaction.timeout.ms": "900000"},
        settings.topic,
        f"hung-{settings.topic}",
    )
    hung.begin([ev("open-1", 1.7, 0), ev("open-2", 1.8, 2)])
    producer.send([ev("after-open", 1.9, 0)])  # committed, but behind the open transaction

    run_slice(spark, settings, 0, 1)
    sl2, _ = run_slice(spark, settings, 1, 2)
    ids = sorted(r.event_id for r in table(spark, settings, "silver").collect())
    assert ids == ["x1", "x2", "x3", "x4"]  # 'after-open' waits behind the open transaction
    lso = TopicOffsets.of(settings).last_stable([0])[0]
    assert sl2.ranges[0][1] <= lso

    hung.commit()
    run_slice(spark, settings, 2, 3)
    silver = table(spark, settings, "silver")
    assert sorted(r.event_id for r in silver.collect()) == [
        "after-open",
        "open-1",
        "open-2",
        "x1",
        "x2",
        "x3",
        "x4",
    ]
    # Survivors are the lowest Kafka position of each id.
    survivors = {r.event_id: (r.kafka_partition, r.kafka_offset) for r in silver.collect()}
    bronze = table(spark, settings, "bronze").collect()
    for event_id, position in survivors.items():
        copies = [
            (b.partition, b.offset) for b in bronze if json.loads(b.value)["event_id"] == event_id
        ]
        assert position == min(copies)


def test_reverse_order_gives_the_same_silver(spark, pipeline, pipeline_factory):
    settings, producer = pipeline
    for h in range(4):
        producer.send([ev(f"id-{(h * 5 + i) % 7}", h + i / 10, i % 3) for i in range(6)])
    for h in range(4):
        run_slice(spark, settings, h, h + 1)
    reverse, _ = pipeline_factory(topic=settings.topic)
    for h in reversed(range(4)):
        run_slice(spark, reverse, h, h + 1)
    assertDataFrameEqual(table(spark, reverse, "silver"), table(spark, settings, "silver"))


def copies_of(spark, *copies: tuple[str, int, int]):
    """Silver rows of the example definition: (event_id, partition, offset) each."""
    events = load_pipelines()["events"]
    rows = [(i, "click", at(0), "{}", at(0).date(), p, o, at(0), "slice") for i, p, o in copies]
    return events, spark.createDataFrame(rows, silver_schema(events))


@pytest.mark.parametrize("racer, kept", [((0, 10**9), (0, 5)), ((0, 1), (0, 1))])
def test_a_copy_committed_just_before_the_merge(spark, tmp_path, racer, kept):
    """Another writer stored a copy of a key just before the slice's MERGE read silver:
    a copy ours beats is replaced, a better one stays."""
    path, reach = str(tmp_path / "silver"), Reach((at(0).date(), at(0).date()))
    events, ours = copies_of(spark, ("k", 0, 5), ("other", 1, 7))
    _, copy = copies_of(spark, ("k", *racer))

    def racing_writer() -> None:
        copy.write.format("delta").mode("append").save(path)

    silver_module.merge_into_silver(spark, path, events, ours, reach, "slice-a", "a", racing_writer)
    stored = spark.read.format("delta").load(path)
    assert sorted((r.event_id, r.kafka_partition, r.kafka_offset) for r in stored.collect()) == [
        ("k", *kept),
        ("other", 1, 7),
    ]


def test_a_retry_whose_merge_delta_skipped_replaces_a_copy_the_first_attempt_left(spark, tmp_path):
    """An attempt of an earlier slicewise merged insert-only after its probe, while a
    racer stored a worse copy, and died before its check: silver holds the worse copy,
    and Delta skips the retry's MERGE (same idempotent-write id, here spent by an empty
    append standing in for that commit). The retry finds the beaten copy on its own and
    replaces it."""
    path, reach = str(tmp_path / "silver"), Reach((at(0).date(), at(0).date()))
    events, ours = copies_of(spark, ("k", 0, 5))
    _, worse = copies_of(spark, ("k", 2, 9))
    worse.write.format("delta").mode("append").save(path)
    append_once(worse.limit(0), path, "slice-a", {"step": "an earlier insert-only MERGE"})
    silver_module.merge_into_silver(spark, path, events, ours, reach, "slice-a", "a")
    stored = spark.read.format("delta").load(path)
    assert [(r.kafka_partition, r.kafka_offset) for r in stored.collect()] == [(0, 5)]


def test_every_malformed_kind_is_quarantined_and_counts_reconcile(spark, pipeline):
    settings, producer = pipeline
    bad = [
        None,
        b"{not json",
        b"[1]",
        json.dumps({"event_type": "a"}).encode(),
        event_value("  ", at(0.1)),
        event_value(7, at(0.1)),
        event_value("q1", at(0.1)).replace(b"Z", b""),
        b"\xff\xfe",
    ]
    producer.send(
        [Record(v, i % 3, at(0.2)) for i, v in enumerate(bad)]
        + [ev("good-1", 0.3, 0), ev("good-1", 0.3, 1), ev("good-2", 0.4, 2)]
    )
    sl, counts = run_slice(spark, settings, 0, 1)
    reasons = sorted(r.reason for r in table(spark, settings, "quarantine").collect())
    assert reasons == sorted(
        [
            "null_value",
            "invalid_json",
            "not_an_object",
            "missing:event_id",
            "blank:event_id",
            "wrong_type:event_id",
            "unparseable_time:occurred_at",
            "invalid_utf8",
        ]
    )
    assert (
        counts.read,
        counts.quarantined,
        counts.duplicates_in_slice,
        counts.inserted,
        counts.missing,
    ) == (11, 8, 1, 2, 0)
    assert counts.reconciles
    q = table(spark, settings, "quarantine").where(F.col("reason") == "invalid_json").first()
    assert (q.topic, q.value, q.slice_id) == (settings.topic, b"{not json", sl.slice_id)


@pytest.fixture(params=["local-disk", "object-store"])
def on_any_store(request, pipeline_factory):
    """A pipeline whose lakehouse and ledger are on local disk, or in an S3 bucket."""
    if request.param == "object-store":
        return pipeline_factory(SLICEWISE_LAKEHOUSE=request.getfixturevalue("s3_lakehouse"))
    return pipeline_factory()


def race(spark_remote: str, settings, step, slice_id: str) -> list:
    """`step` of one slice by two client sessions of one server at once (a zombie attempt
    and its retry); their results, once neither failed (the loser re-checked and found
    the slice done)."""
    results, errors = [], []

    def attempt():
        try:
            session = remote_session(spark_remote, fresh=True)
            try:
                results.append(step(session, settings, slice_id))
            finally:
                session.stop()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == [] and len(results) == 2
    return results


def test_concurrent_attempts_of_one_slice_commit_once(spark, spark_remote, on_any_store):
    """A zombie attempt and its retry race, as two client sessions of one server;
    the tables end as if one ran."""
    settings, producer = on_any_store
    producer.send([ev(f"z-{i}", 0.1 + i / 1000, i % 3) for i in range(300)])
    sl = plan_slice(settings, at(0), at(1), now=LATER)
    assert all(until - frm == 101 for frm, until in sl.ranges.values()), sl.describe()  # + marker

    bronze_results = race(spark_remote, settings, run_bronze, sl.slice_id)
    assert sorted(r.committed for r in bronze_results) == [False, True]  # exactly one commit
    race(spark_remote, settings, run_silver, sl.slice_id)
    bronze, silver = table(spark, settings, "bronze"), table(spark, settings, "silver")
    assert bronze.count() == 300 == bronze.select("partition", "offset").distinct().count()
    assert silver.count() == 300 == silver.select("event_id").distinct().count()


def test_two_runs_publishing_at_once_both_land_in_gold(spark, spark_remote, pipeline):
    """A backfill two at a time: the first two publications race to create gold."""
    from slicewise.gate import run_gate
    from slicewise.publish import run_publish

    settings, producer = pipeline
    producer.send([ev(f"g-{i}", 0.1 + i / 10, i % 3) for i in range(5)])
    producer.send([ev(f"h-{i}", 1.1 + i / 10, i % 3) for i in range(7)])
    slices = [run_slice(spark, settings, h, h + 1)[0] for h in (0, 1)]
    for sl in slices:
        run_gate(spark, settings, sl.slice_id)
    errors, barrier = [], threading.Barrier(2)

    def publish(slice_id):
        try:
            session = remote_session(spark_remote, fresh=True)
            try:
                barrier.wait()
                run_publish(session, settings, slice_id)
            finally:
                session.stop()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(sl.slice_id,)) for sl in slices]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    gold = table(spark, settings, "gold_events_per_hour")
    assert gold.agg(F.sum("events")).first()[0] == 12


def test_an_attempt_whose_write_delta_skipped_does_not_report_a_commit(spark, pipeline):
    """A rerun, or the loser of a race that writes after the winner committed: bronze is
    not probed while Kafka holds the slice, and Delta skips the write (same
    idempotent-write id) without an error and without reading Kafka."""
    settings, producer = pipeline
    producer.send([ev(f"s-{i}", 0.1 + i / 1000, i % 3) for i in range(30)])
    sl = plan_slice(settings, at(0), at(1), now=LATER)
    assert run_bronze(spark, settings, sl.slice_id).committed
    late = run_bronze(spark, settings, sl.slice_id)
    assert (late.committed, late.rows) == (False, 30)
    bronze = table(spark, settings, "bronze")
    assert bronze.count() == 30 == bronze.select("partition", "offset").distinct().count()


def test_quarantine_replay_after_a_fix_moves_records_to_silver(
    spark, pipeline_factory, monkeypatch
):
    settings, producer = pipeline_factory(SLICEWISE_MAX_VALUE_BYTES="120")
    big = event_value("big-1", at(0.2), payload={"text": "x" * 200})
    producer.send([Record(big, 0, at(0.2)), ev("small-1", 0.3, 1)])
    sl, counts = run_slice(spark, settings, 0, 1)
    assert (counts.quarantined, counts.inserted) == (1, 1)
    assert table(spark, settings, "quarantine").first().reason == "oversized_value"

    from dataclasses import replace

    from slicewise.replay import run_replay

    fixed = replace(settings, max_value_bytes=1_048_576)  # the fix: a larger limit
    # A replay cut off before its MERGE commits (a lost race, a killed task) leaves the
    # record in quarantine: quarantine is replaced only once silver holds the record.
    with monkeypatch.context() as cut_off:
        cut_off.setattr(silver_module, "merge_survivors", fail_merge)
        with pytest.raises(RuntimeError, match="cut off"):
            run_replay(spark, fixed, sl.slice_id)
    assert table(spark, settings, "quarantine").count() == 1
    replayed = run_replay(spark, fixed, sl.slice_id)  # the rerun
    assert (replayed.quarantined, replayed.inserted, replayed.missing) == (
        0,
        2,
        0,
    ) and replayed.reconciles
    assert sorted(r.event_id for r in table(spark, settings, "silver").collect()) == [
        "big-1",
        "small-1",
    ]
    assert table(spark, settings, "quarantine").count() == 0
    assert run_replay(spark, fixed, sl.slice_id) == replayed  # safe to repeat


def fail_merge(*_args, **_kwargs):
    raise RuntimeError("cut off before the MERGE committed")


def test_a_duplicate_in_silver_fails_the_gate_naming_it(spark, pipeline, tmp_path):
    """The gate validates facts from one query; a failed row fact brings in the
    row-level suite, so the message and Data Docs name the offending id."""
    from slicewise.cli import fetch_docs
    from slicewise.data_docs import location
    from slicewise.gate import GateFailed, run_gate

    settings, producer = pipeline
    producer.send([ev("a", 0.1, 0), ev("b", 0.2, 1), ev("a", 0.3, 2)])
    sl, _ = run_slice(spark, settings, 0, 1)
    passed = run_gate(spark, settings, sl.slice_id)
    assert passed["success"] and len(passed["data_docs"]) == 1
    assert (passed["counts"]["read"], passed["counts"]["inserted"]) == (3, 2)

    # A bad write by hand (no slice's tag): the gate run after it validates silver as it
    # is now, so it sees it.
    silver = table(spark, settings, "silver")
    silver.where(F.col("event_id") == "b").write.format("delta").mode("append").save(
        settings.table("silver")
    )
    with pytest.raises(GateFailed) as failed:
        run_gate(spark, settings, sl.slice_id)
    message = str(failed.value)
    print(message)  # the RUNBOOK quotes it
    assert (
        "expect_column_pair_values_to_be_equal(read, accounted): 1 unexpected, e.g. [(3, 4)]"
        in (message)
    )
    assert "expect_column_values_to_be_between(duplicate_keys)" in message
    assert "expect_column_values_to_be_unique(event_id): 2 unexpected, e.g. ['b']" in message
    gate = Ledger.of(settings).step(sl.slice_id, "gate")
    assert gate["success"] is False and gate["counts"]["inserted"] == 3
    # Kept in the lakehouse: fetched from there once the gate host's own site is gone.
    assert len(gate["data_docs"]) == 2
    assert all(p.startswith(f"{location(settings)}/validations/") for p in gate["data_docs"])
    shutil.rmtree(settings.data_docs_dir)
    pages = fetch_docs(settings, sl.slice_id, tmp_path / "fetched")
    assert [p.suffix for p in pages] == [".html", ".html"] and "duplicate_keys" in pages[
        0
    ].read_text()
    assert "event_id" in pages[1].read_text() and (tmp_path / "fetched" / "static").is_dir()


def test_gold_follows_an_event_that_a_later_slice_moves_to_another_hour(spark, pipeline):
    """Found by `make demo`: a later slice's copy at a lower Kafka position replaces the
    stored copy, whose occurred_at lay in an hour published before; gold must follow."""
    from slicewise.gate import run_gate
    from slicewise.publish import run_publish

    settings, producer = pipeline
    producer.send([ev("moved", 0.5, 2), ev("stays", 0.6, 2)])  # hour 0, partition 2
    producer.send([ev("moved", 1.5, 0)])  # hour 1, partition 0: the lower position wins
    for h in range(2):
        sl, _ = run_slice(spark, settings, h, h + 1)
        run_gate(spark, settings, sl.slice_id)
        run_publish(spark, settings, sl.slice_id)
    silver = table(spark, settings, "silver")
    expected = (
        silver.groupBy(F.date_trunc("hour", "occurred_at").alias("hour"), "event_type")
        .agg(F.count("*").alias("events"))
        .orderBy("hour")
    )
    gold = table(spark, settings, "gold_events_per_hour")
    assertDataFrameEqual(gold.select("hour", "event_type", "events"), expected)
    assert gold.agg(F.sum("events")).first()[0] == 2


def test_an_open_transaction_holding_the_lso_is_reported_then_fails_planning_once_overdue(
    pipeline, kafka_bootstrap, caplog, capsys, monkeypatch
):
    settings, producer = pipeline
    ledger = Ledger.of(settings)
    producer.send([ev("before", 0.2, 1)])
    # Open for two slices: longer than the producer's default 60 s on a loaded host, when
    # the coordinator aborted it and its commit failed as fenced (fresh-clone CI, 2026-12-01).
    hung = TxProducer(
        {"bootstrap.servers": kafka_bootstrap, "transaction.timeout.ms": "900000"},
        settings.topic,
        f"hung-{settings.topic}",
    )
    hung.begin([ev("open", 0.5, 1)])
    producer.send([ev("behind", 0.6, 1)])  # committed, but past the open transaction

    caplog.set_level("WARNING", logger="slicewise.planner")
    plan_slice(settings, at(0), at(1), now=LATER)  # reported, not failed: it may end soon
    [hold] = ledger.holds().values()
    assert (hold.partition, hold.since) == (1, LATER) and hold.waiting >= 2
    assert "partition 1: last stable offset held at" in caplog.text

    cli_env(monkeypatch, settings, kafka_bootstrap)
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"HELD partition 1: last stable offset held at {hold.offset}" in out
    # Freshness: the newest boundary (hour 1) stops at the hold, the records past it wait.
    assert f"FRESHNESS newest boundary {at(1).isoformat()}" in out
    assert "offsets behind the LSO: p0 0, p1 0" in out  # the LSO is the hold itself

    # Still held at the same offset past SLICEWISE_MAX_OPEN_TRANSACTION_SECONDS (900):
    # the next interval is refused, naming it, and nothing is frozen.
    with pytest.raises(
        StuckTransaction,
        match=rf"partition 1: last stable offset held at {hold.offset} .*SLICEWISE_MAX_OPEN_TRANSACTION_SECONDS=900",
    ):
        plan_slice(settings, at(1), at(2), now=LATER + timedelta(minutes=16))
    assert ledger.boundary(at(2)) is None

    hung.commit()  # the transaction ends: planning goes on, and the slice takes it all
    assert cli.main(["status", "--json"]) == 0  # before it does, the records wait behind the LSO
    behind = json.loads(capsys.readouterr().out)["freshness"]["behind_last_stable"]
    assert behind["1"] == TopicOffsets.of(settings).last_stable([1])[1] - hold.offset >= 2
    sl = plan_slice(settings, at(1), at(2), now=LATER + timedelta(minutes=17))
    assert ledger.holds() == {}
    first = ledger.load_slice(f"{at(0):%Y%m%dT%H%M%SZ}-{at(1):%Y%m%dT%H%M%SZ}")
    assert first.ranges[1][1] == hold.offset  # the first slice stopped short of the hold
    assert sl.ranges[1][0] == hold.offset
