"""Bronze: exactly the slice's committed records, raw, with their coordinates.

The write carries a Delta idempotent-write id (txnAppId = slicewise/bronze/<slice>), so a
rerun of a committed slice is a no-op and, of two attempts racing, only one can
commit: the loser fails with a concurrent-transaction conflict and its retry
finds the slice done. If the loser only starts writing after the winner's commit,
Delta skips its write silently, so each attempt tags its commit and looks for the tag
afterwards before it reports a commit. The slice's offsets travel in the same
commit's userMetadata, so rows and offsets cannot disagree.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from slicewise.config import Settings
from slicewise.errors import OperationalError
from slicewise.faults import fault_point
from slicewise.kafka.offsets import KafkaUnavailable, TopicOffsets
from slicewise.ledger import BRONZE_DROPPED, Ledger, slice_to_json
from slicewise.schemas import BRONZE
from slicewise.slices import (
    DataLoss,
    DataLossError,
    Slice,
    TopicReset,
    find_data_loss,
    offsets_went_back,
)
from slicewise.tables import (
    append_once,
    commit_metrics,
    conform,
    ids_may_be_forgotten,
    of_slice,
    retry_on_conflict,
    table_exists,
)

log = logging.getLogger(__name__)


class BronzeDropped(OperationalError):
    """Bronze retention deleted the rows of this (published) slice."""


def require_bronze_rows(ledger: Ledger, slice_id: str) -> None:
    """Refuse a step that needs the slice's bronze rows once retention deleted them:
    a re-ingest would find Kafka's copy gone too, and a gate would count nothing."""
    dropped = ledger.step(slice_id, BRONZE_DROPPED)
    if dropped is not None:
        raise BronzeDropped(
            f"slice {slice_id} was published, and bronze retention (maintenance.bronze_retain) "
            f"deleted its bronze rows at {dropped['recorded_at']}. Its silver rows and gold "
            "stay as published; it cannot be ingested, gated or replayed again. Nothing was "
            "changed."
        )


@dataclass(frozen=True)
class BronzeResult:
    slice_id: str
    rows: int
    committed: bool  # False when the slice was already in bronze


def kafka_options(
    settings: Settings, sl: Slice, ranges: dict[int, tuple[int, int]]
) -> dict[str, str]:
    """Spark Kafka source options for a batch read of exactly `ranges`."""
    parts = sorted(p for p, (a, b) in ranges.items() if a < b)
    # A topic has few partitions and a slice is read once: one task per partition would
    # leave cores idle (3 partitions on 2 cores take 2 rounds of the largest). Splitting
    # each range into tasks of at most `records_per_task` records spreads the read, the
    # parse and the write over every core.
    split = (
        {"maxRecordsPerPartition": str(settings.records_per_task)}
        if settings.records_per_task
        else {}
    )
    return {
        **split,
        "kafka.bootstrap.servers": settings.bootstrap_servers,
        "kafka.isolation.level": "read_committed",
        "assign": json.dumps({sl.topic: parts}),
        "startingOffsets": json.dumps({sl.topic: {str(p): ranges[p][0] for p in parts}}),
        "endingOffsets": json.dumps({sl.topic: {str(p): ranges[p][1] for p in parts}}),
        "includeHeaders": "true",
        **{f"kafka.{k}": v for k, v in settings.spark_kafka_props.items()},
    }


def to_bronze(kafka_df: DataFrame, slice_id: str) -> DataFrame:
    """Kafka source rows -> bronze rows (pure)."""
    return conform(
        kafka_df.withColumnRenamed("timestampType", "timestamp_type").withColumn(
            "slice_id", F.lit(slice_id)
        ),
        BRONZE,
    )


def read_slice(
    spark: SparkSession, settings: Settings, sl: Slice, ranges: dict[int, tuple[int, int]]
) -> DataFrame:
    if not any(a < b for a, b in ranges.values()):
        return spark.createDataFrame([], BRONZE)
    reader = spark.read.format("kafka")
    for key, value in kafka_options(settings, sl, ranges).items():
        reader = reader.option(key, value)
    return to_bronze(reader.load(), sl.slice_id)


def slice_in_bronze(spark: SparkSession, path: str, slice_id: str) -> bool:
    if not table_exists(spark, path):
        return False
    return of_slice(spark, path, BRONZE, slice_id).limit(1).count() > 0


def run_bronze(
    spark: SparkSession, settings: Settings, slice_id: str, accept_data_loss: bool = False
) -> BronzeResult:
    """Ingest one planned slice into bronze, exactly once."""
    return retry_on_conflict(
        lambda: _bronze(spark, settings, slice_id, accept_data_loss), f"bronze of {slice_id}"
    )


def _bronze(
    spark: SparkSession, settings: Settings, slice_id: str, accept_data_loss: bool
) -> BronzeResult:
    ledger = Ledger.of(settings)
    sl = ledger.load_slice(slice_id)
    readable = readable_ranges(spark, settings, ledger, sl, accept_data_loss)
    if readable is None:
        return stored_slice(spark, settings, ledger, sl)
    ranges, metadata = readable
    # One pass: Kafka straight into the Delta commit; the row count comes from the
    # commit's own metrics rather than from a second read of the slice.
    return commit_bronze(
        spark, settings, ledger, sl, read_slice(spark, settings, sl, ranges), metadata
    )


def stored_slice(
    spark: SparkSession, settings: Settings, ledger: Ledger, sl: Slice
) -> BronzeResult:
    """Bronze's copy of the slice, counted and recorded again (nothing is written)."""
    rows = of_slice(spark, settings.table("bronze"), BRONZE, sl.slice_id).count()
    log.info("%s is already in bronze (%d rows); nothing to do", sl.describe(), rows)
    ledger.record_step(sl.slice_id, "bronze", {"rows": rows})
    return BronzeResult(sl.slice_id, rows, committed=False)


def readable_ranges(
    spark: SparkSession, settings: Settings, ledger: Ledger, sl: Slice, accept_data_loss: bool
) -> tuple[dict[int, tuple[int, int]], dict] | None:
    """The offsets to read and the bronze commit's metadata: the slice's own, or, when
    Kafka deleted part of it and the override accepts that, what Kafka still retains
    (the loss logged in the ledger and the commit). Without the override a loss raises
    `DataLossError` before anything is read, and a topic that is no longer the log the
    slice was frozen in (recreated, or its offsets went back) raises `TopicReset`: its
    offsets would read other records. The override then records the whole slice lost.

    None when Kafka cannot vouch for the slice (a loss, a reset, no broker or no topic)
    but bronze holds it: a retry after bronze committed, which reads bronze's copy and
    records no loss. Bronze is probed only then. On the common path a rerun appends the
    slice again and Delta skips that write by its idempotent-write id before anything
    is read (`commit_bronze`), so a step need not pay a scan of bronze first."""
    require_bronze_rows(ledger, sl.slice_id)
    try:
        changes, losses = kafka_gaps(settings, ledger, sl)
    except KafkaUnavailable:
        if slice_in_bronze(spark, settings.table("bronze"), sl.slice_id):
            return None
        raise
    if (changes or losses) and slice_in_bronze(spark, settings.table("bronze"), sl.slice_id):
        return None
    ranges = dict(sl.ranges)
    metadata = {"step": "bronze", **slice_to_json(sl)}
    if changes:
        if not accept_data_loss:
            raise TopicReset(
                f"{sl.describe()}: the topic is no longer the log this slice was frozen in: "
                f"{'; '.join(changes)}. Its offsets would read other records; nothing was read. "
                "Safe next step: if the records can be re-produced, do that and replan; otherwise "
                "rerun with the data-loss override (DAG param accept_data_loss=true, or "
                f"`slicewise ingest --slice-id {sl.slice_id} --accept-data-loss`) to record the "
                "slice as lost (docs/RUNBOOK.md#topic-reset)."
            )
        log.warning("DATA LOSS ACCEPTED by override: %s is gone (%s)", sl.describe(), changes)
        ranges = {p: (until, until) for p, (_, until) in ranges.items()}
        metadata["topic_reset_accepted"] = changes
        ledger.record_step(sl.slice_id, "data_loss_ack", {"topic_reset": changes})
        return ranges, metadata
    if losses:
        error = DataLossError.in_slice(sl, losses)
        if not accept_data_loss:
            raise error
        log.warning("DATA LOSS ACCEPTED by override:\n%s", error)
        for d in losses:
            ranges[d.partition] = (d.missing_until, ranges[d.partition][1])
        metadata["data_loss_accepted"] = [d.__dict__ for d in losses]
        ledger.record_step(sl.slice_id, "data_loss_ack", {"losses": [d.__dict__ for d in losses]})
    return ranges, metadata


def kafka_gaps(settings: Settings, ledger: Ledger, sl: Slice) -> tuple[list[str], list[DataLoss]]:
    """How Kafka no longer holds the slice, read from the broker's offsets only: the ways
    the topic contradicts the slice's upper boundary (a reset), else the offset ranges
    retention deleted (losses). Both empty when every record is still there."""
    offsets = TopicOffsets.of(settings)
    partitions = list(sl.ranges)
    upper = ledger.boundary(sl.end)
    if upper is not None:
        changes = offsets_went_back(upper, offsets.topic_id(), offsets.last_stable(partitions))
        if changes:
            return changes, []
    return [], find_data_loss(sl, offsets.earliest(partitions))


def commit_bronze(
    spark: SparkSession,
    settings: Settings,
    ledger: Ledger,
    sl: Slice,
    rows: DataFrame,
    metadata: dict,
) -> BronzeResult:
    """Append the slice's bronze `rows` once (its idempotent-write id), and record it.

    `committed` is False when another attempt's commit holds the slice: Delta then
    skips this write without an error, so the attempt's tag tells the two apart."""
    path = settings.table("bronze")
    retain = settings.pipeline.maintenance.vacuum_retain
    if ids_may_be_forgotten(sl.end, retain, settings.step_timeout):
        # A slice written once more than `vacuum_retain` ago: Delta may have forgotten the
        # write's id, so the rows tell (an earlier attempt's commit holds them, or none).
        stored = of_slice(spark, path, BRONZE, sl.slice_id).count()
        if stored:
            log.info("%s: bronze holds its %d rows already; nothing to do", sl.describe(), stored)
            ledger.record_step(sl.slice_id, "bronze", {"rows": stored})
            return BronzeResult(sl.slice_id, stored, committed=False)
    attempt = uuid.uuid4().hex
    append_once(rows, path, f"slicewise/bronze/{sl.slice_id}", {**metadata, "attempt": attempt})
    metrics = commit_metrics(spark, path, attempt)
    if metrics is None:
        rows_stored = of_slice(spark, path, BRONZE, sl.slice_id).count()
        log.info("%s was committed by a concurrent attempt; nothing to do", sl.describe())
        ledger.record_step(sl.slice_id, "bronze", {"rows": rows_stored})
        return BronzeResult(sl.slice_id, rows_stored, committed=False)
    count = int(metrics.get("numOutputRows", 0))
    fault_point("bronze.committed", settings, sl.slice_id)
    ledger.record_step(sl.slice_id, "bronze", {"rows": count})
    log.info("bronze committed %s: %d rows", sl.describe(), count)
    return BronzeResult(sl.slice_id, count, committed=True)
