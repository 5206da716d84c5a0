"""Publication walks silver's commits above the last published version (issue 93,
findings 9 and 10). A commit no slice step made (a write by hand) counted as proved,
so a bad manual write reached gold without any gate; it is proved now only once a
passing gate ran at or above it, and publication reads the version before it until
then. Delta's log cleanup removes commits older than `delta.logRetentionDuration`
below a checkpoint; when that cuts above the last publication (a failed gate left
unrepaired that long, every publication since refused), the walk would start above
the cut and never meet the failed slice's commit, publishing its rows. It is refused
now, naming the missing versions, until on-call accepts it by hand."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql import functions as F

from slicewise.commits import HistoryTruncated, commits_above
from slicewise.gate import GateFailed, run_gate
from slicewise.ingest import run_ingest
from slicewise.planner import plan_slice
from slicewise.publish import GateNotPassed, run_publish
from slicewise.tables import table_version
from slicewise_dev.producer import Record, event_value

pytestmark = pytest.mark.integration


def test_a_log_cleaned_up_above_the_last_publication_is_refused_until_accepted(spark, tmp_path):
    path = str(tmp_path / "silver")
    for v in range(12):  # versions 0-11; Delta checkpoints at 10 (checkpointInterval)
        (
            spark.range(v, v + 1)
            .write.format("delta")
            .mode("append")
            .option("userMetadata", f"slicewise slices=s{v} attempt=a{v}")
            .save(path)
        )
    log = tmp_path / "silver" / "_delta_log"
    assert (log / f"{10:020d}.checkpoint.parquet").exists()
    for v in range(10):  # what the cleanup deletes: the commits the checkpoint covers
        (log / f"{v:020d}.json").unlink()
        (log / f"{v:020d}.crc").unlink(missing_ok=True)

    with pytest.raises(HistoryTruncated, match=r"no longer holds versions 3-9") as refused:
        commits_above(spark, path, 2)
    assert "--accept-truncated-history" in str(refused.value)
    accepted = commits_above(spark, path, 2, accept_truncated=True)
    assert [(c.version, c.slices) for c in accepted] == [(10, ("s10",)), (11, ("s11",))]
    # A floor the log still reaches is walked as before.
    assert [c.version for c in commits_above(spark, path, 9)] == [10, 11]


def test_a_write_by_hand_reaches_gold_only_after_a_gate_saw_it(spark, pipeline):
    settings, producer = pipeline
    t0 = (datetime.now(timezone.utc) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    producer.send([Record(event_value(f"e{i}", t0), i % 3, t0) for i in range(6)])
    sl = plan_slice(settings, t0, t0 + timedelta(hours=1), now=t0 + timedelta(days=2))
    run_ingest(spark, settings, sl.slice_id)
    run_gate(spark, settings, sl.slice_id)

    # A bad manual write after the gate: a second row of e0.
    silver = settings.table("silver")
    rows = spark.read.format("delta").load(silver)
    rows.where(F.col("event_id") == "e0").write.format("delta").mode("append").save(silver)
    hand = table_version(spark, silver)

    # Publication reads the version before it: no gate has seen it (before: counted as
    # proved, and gold counted e0 twice).
    first = run_publish(spark, settings, sl.slice_id)
    assert first.silver_version == hand - 1
    assert gold_events(spark, settings) == 6
    with pytest.raises(GateFailed):  # the gate run again validates silver as it is now
        run_gate(spark, settings, sl.slice_id)
    with pytest.raises(GateNotPassed):
        run_publish(spark, settings, sl.slice_id)

    # On-call repairs by hand (one row of e0 again); the gate passes, publication with it.
    keep = rows.where(F.col("event_id") == "e0").limit(1).collect()
    rows.where(F.col("event_id") != "e0").union(
        spark.createDataFrame(keep, rows.schema)
    ).write.format("delta").mode("overwrite").save(silver)
    run_gate(spark, settings, sl.slice_id)
    assert run_publish(spark, settings, sl.slice_id).silver_version == hand + 1
    assert gold_events(spark, settings) == 6


def gold_events(spark, settings) -> int:
    gold = spark.read.format("delta").load(settings.table("gold_events_per_hour"))
    return gold.agg(F.sum("events")).first()[0]
