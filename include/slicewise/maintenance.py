"""Maintenance: the pipeline's tables kept small and lean beside its live slices.

One run (the pipeline's maintenance DAG, daily by default; `slicewise maintain`):

1. Compaction (OPTIMIZE) of bronze, quarantine, `slice_ids` and gold, and of every
   silver event date before today's (UTC). Each MERGE reads the dates of its slice
   widened by the dedup horizon, so those dates must stay few files (on an object
   store each file is a request); only today's date, which every slice writes, is
   left to the next run. Delta rewrites only the small files (and those with many
   deleted rows), so a compacted date is left alone.
2. Purge of silver's deletion vectors in the settled dates (REORG TABLE ... APPLY
   (PURGE)), those older than the dedup horizon plus a day, which the MERGE of a slice
   of today's events no longer reaches: a MERGE that replaced a row marked it deleted
   instead of rewriting its file.
3. Bronze retention, when the definition asks for it: the rows of published slices
   that ended longer ago than `maintenance.bronze_retain`. A slice that is not
   published keeps its rows whatever its age, and the ledger notes each slice dropped.
4. VACUUM of every table: files removed longer ago than `maintenance.vacuum_retain`
   are deleted. That span is the reach of time travel, and it may not be shorter than
   a step attempt may run (SLICEWISE_STEP_TIMEOUT): a running attempt never loses a
   file of the snapshot it reads, nor a file it is still writing.
5. The key index (`key_index`): the slices `slice_ids` recorded since the last run,
   added as one run sorted by key, so that a slice's lookup of its keys' far copies
   costs what the slice and that tail cost, not the whole history. Never compacted:
   OPTIMIZE would undo the sort.

Live slices write beside it. Each command commits once per table; when a slice's
commit wins the race Delta fails the loser, which runs again (`retry_on_conflict`) and
finds the winner's commit: the slice's own writes are idempotent, and compaction,
purge and deletion only re-plan on the new snapshot. Nothing is lost or doubled. (A
slice MERGEing yesterday's dates while they are compacted is such a race, about once
a run.)
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timedelta, timezone

from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F

from slicewise import key_index
from slicewise.config import Settings
from slicewise.errors import OperationalError
from slicewise.ledger import BRONZE_DROPPED, Ledger
from slicewise.pipelines import Maintenance
from slicewise.slices import slice_interval, stamp
from slicewise.tables import delta_ref, history, retry_on_conflict, table_exists, table_version

log = logging.getLogger(__name__)

# Every table of a pipeline, in the order maintenance visits them.
TABLES = ("bronze", "silver", "quarantine", "slice_ids", "gold_events_per_hour")
# Delta keeps the log this long at least (its default): time travel needs log and files.
MIN_LOG_RETENTION = timedelta(days=30)


class RetentionTooShort(OperationalError):
    """`maintenance.vacuum_retain` is shorter than a step attempt may run."""


@dataclass
class TableUpkeep:
    """What one run did to one table."""

    table: str
    files_before: int = 0
    files_after: int = 0
    files_compacted: int = 0  # small files (or files with deleted rows) rewritten
    deletion_vectors_purged: int = 0
    slices_dropped: list[str] = field(default_factory=list)  # bronze retention
    files_vacuumed: int = 0
    bytes_vacuumed: int = 0


@dataclass(frozen=True)
class MaintenanceResult:
    pipeline: str
    compacted_before: str  # silver's event dates before this one were compacted
    settled_before: str  # ... and those before this one purged of deletion vectors
    tables: list[TableUpkeep]
    kept_unpublished: list[str]  # slices older than bronze_retain that are not published


def check_retention(policy: Maintenance, step_timeout: timedelta, pipeline: str) -> None:
    """Refuse a VACUUM retention that could delete a file a running attempt still reads."""
    if policy.vacuum_retain < step_timeout:
        raise RetentionTooShort(
            f"pipeline {pipeline!r}: maintenance.vacuum_retain is {policy.vacuum_retain}, "
            f"shorter than a step attempt may run (SLICEWISE_STEP_TIMEOUT = {step_timeout}): "
            "VACUUM could delete files a running attempt still reads or writes. Raise "
            "maintenance.vacuum_retain in the pipeline definition (7d by default), or lower "
            "SLICEWISE_STEP_TIMEOUT. Nothing was changed."
        )


def settled_before(now: datetime, horizon_days: int) -> date:
    """The first event date a slice of events around `now` may still MERGE into."""
    return (now - timedelta(days=horizon_days + 1)).date()


def retention_properties(policy: Maintenance) -> dict[str, str]:
    """The table properties VACUUM, the log's cleanup and Delta's idempotent-write ids
    obey (stated on every table). The ids are kept as long as removed files: a slice
    written once longer ago is rewritten only where its rows are not there already
    (`tables.ids_may_be_forgotten`), and a table's state stays as small as its recent
    slices' ids, not all of them."""
    log_retention = max(policy.vacuum_retain, MIN_LOG_RETENTION)
    return {
        "delta.deletedFileRetentionDuration": _interval(policy.vacuum_retain),
        "delta.logRetentionDuration": _interval(log_retention),
        "delta.setTransactionRetentionDuration": _interval(policy.vacuum_retain),
    }


def _interval(span: timedelta) -> str:
    return f"interval {int(span.total_seconds())} seconds"


def run_maintenance(
    spark: SparkSession, settings: Settings, now: datetime | None = None
) -> MaintenanceResult:
    pipeline = settings.pipeline
    policy = pipeline.maintenance
    check_retention(policy, settings.step_timeout, pipeline.name)
    now = now or datetime.now(timezone.utc)
    today, settled = now.date(), settled_before(now, pipeline.horizon_days)
    # VACUUM records what it deleted (files, bytes) in the table's history: on by default
    # on cloud stores, asked for here so that a local lakehouse reports the same.
    spark.conf.set("spark.databricks.delta.vacuum.logging.enabled", "true")
    # VACUUM lists the table's folders with up to this many tasks, 10,000 by default:
    # 30 s for a table of a few files on 2 cores, against 2 s with as many as a shuffle.
    spark.conf.set(
        "spark.sql.sources.parallelPartitionDiscovery.parallelism",
        spark.conf.get("spark.sql.shuffle.partitions"),
    )
    ledger = Ledger.of(settings)
    upkeep, kept = [], []
    for name in TABLES:
        path = settings.table(name)
        if not table_exists(spark, path):
            continue
        detail = describe(spark, path)
        done = TableUpkeep(name, files_before=int(detail["numFiles"]))
        if name == "silver":
            done.files_compacted = compact(spark, path, name, _dates_before(today))
            done.deletion_vectors_purged = purge_deletion_vectors(
                spark, path, _dates_before(settled)
            )
        else:
            done.files_compacted = compact(spark, path, name)
        if name == "bronze" and policy.bronze_retain is not None:
            done.slices_dropped, kept = drop_old_bronze(
                spark, path, ledger, now - policy.bronze_retain
            )
        state_retention(spark, path, name, detail["properties"] or {}, policy)
        done.files_vacuumed, done.bytes_vacuumed = vacuum(spark, path)
        done.files_after = int(describe(spark, path)["numFiles"])
        log.info("maintained %s: %s", name, asdict(done))
        upkeep.append(done)
    if table_exists(spark, settings.table("slice_ids")):
        upkeep.append(maintain_key_index(spark, settings, policy))
    return MaintenanceResult(pipeline.name, today.isoformat(), settled.isoformat(), upkeep, kept)


def maintain_key_index(spark: SparkSession, settings: Settings, policy: Maintenance) -> TableUpkeep:
    """5. The key index: the slices recorded since its last run added as a sorted run, or
    it rebuilt (`key_index.refresh`); never compacted (OPTIMIZE would undo the sort),
    vacuumed as the other tables are."""
    path = settings.table(key_index.TABLE)
    before = int(describe(spark, path)["numFiles"]) if table_exists(spark, path) else 0
    refreshed = key_index.refresh(spark, settings)
    done = TableUpkeep(key_index.TABLE, files_before=before)
    if not table_exists(spark, path):
        return done
    detail = describe(spark, path)
    done.files_compacted = int(refreshed.rebuilt) * before
    state_retention(spark, path, key_index.TABLE, detail["properties"] or {}, policy)
    done.files_vacuumed, done.bytes_vacuumed = vacuum(spark, path)
    done.files_after = int(describe(spark, path)["numFiles"])
    log.info("maintained %s: %s (%s)", key_index.TABLE, asdict(done), refreshed)
    return done


def _dates_before(day: date) -> str:
    return f"event_date < DATE'{day.isoformat()}'"


def describe(spark: SparkSession, path: str) -> Row:
    return spark.sql(f"DESCRIBE DETAIL {delta_ref(path)}").first()


def compact(spark: SparkSession, path: str, name: str, where: str | None = None) -> int:
    """OPTIMIZE (bin-packing) of the table, or of the partitions `where` selects; the
    number of files it rewrote."""
    sql = f"OPTIMIZE {delta_ref(path)}" + (f" WHERE {where}" if where else "")
    metrics = retry_on_conflict(lambda: spark.sql(sql).first()["metrics"], f"compaction of {name}")
    return int(metrics["numFilesRemoved"] or 0)


def purge_deletion_vectors(spark: SparkSession, path: str, where: str) -> int:
    """Rewrite the files of the selected partitions that carry deletion vectors; how many."""
    sql = f"REORG TABLE {delta_ref(path)} WHERE {where} APPLY (PURGE)"
    metrics = retry_on_conflict(
        lambda: spark.sql(sql).first()["metrics"], "purge of silver's deletion vectors"
    )
    stats = metrics["deletionVectorStats"]
    return int(stats["numDeletionVectorsRemoved"] or 0) if stats else 0


def drop_old_bronze(
    spark: SparkSession, path: str, ledger: Ledger, cutoff: datetime
) -> tuple[list[str], list[str]]:
    """Delete bronze's rows of the published slices that ended at or before `cutoff`;
    the slices dropped, and those kept because they are not published. Only slices
    still in bronze are looked at, so the cost follows the slices since the last run,
    not the history."""
    older = (
        spark.read.format("delta")
        .load(path)
        .where(F.col("slice_id") < stamp(cutoff))
        .select("slice_id")
        .distinct()
        .collect()
    )
    candidates = sorted(r.slice_id for r in older if slice_interval(r.slice_id)[1] <= cutoff)
    published = [s for s in candidates if ledger.step(s, "publish") is not None]
    kept = [s for s in candidates if s not in published]
    if kept:
        log.warning(
            "bronze retention keeps %d slice(s) older than the retention that are not "
            "published yet: %s",
            len(kept),
            ", ".join(kept[:10]),
        )
    if published:
        # Recorded before the DELETE: cut off between the two, the ledger already says
        # the rows are gone (steps refuse the slice, as after the DELETE) and the next
        # run deletes them. The other order let a replay or a re-ingest run on a slice
        # whose raw copy was being deleted under it, unrecorded.
        for slice_id in published:
            ledger.record_step(slice_id, BRONZE_DROPPED, {"before": cutoff.isoformat()})
        listed = ", ".join(f"'{s}'" for s in published)
        retry_on_conflict(
            lambda: spark.sql(
                f"DELETE FROM {delta_ref(path)} WHERE slice_id IN ({listed})"
            ).collect(),
            "bronze retention",
        )
    return published, kept


def state_retention(
    spark: SparkSession, path: str, name: str, properties: dict[str, str], policy: Maintenance
) -> None:
    """Set the table's retention properties to the policy's, when they differ (a metadata
    commit, which live writers see as a conflict once and retry)."""
    wanted = retention_properties(policy)
    if all(properties.get(k) == v for k, v in wanted.items()):
        return
    listed = ", ".join(f"'{k}' = '{v}'" for k, v in wanted.items())
    log.info("%s: setting %s", name, listed)
    retry_on_conflict(
        lambda: spark.sql(f"ALTER TABLE {delta_ref(path)} SET TBLPROPERTIES ({listed})").collect(),
        f"retention of {name}",
    )


def vacuum(spark: SparkSession, path: str) -> tuple[int, int]:
    """VACUUM with the table's stated retention; the files and bytes it deleted."""
    before = table_version(spark, path)
    spark.sql(f"VACUUM {delta_ref(path)}").collect()
    started = (
        history(spark, path, 50)
        .where((F.col("version") > before) & (F.col("operation") == "VACUUM START"))
        .orderBy(F.col("version").desc())
        .select("operationMetrics")
        .first()
    )
    if started is None:
        return 0, 0
    metrics = started["operationMetrics"] or {}
    return int(metrics.get("numFilesToDelete", 0)), int(metrics.get("sizeOfDataToDelete", 0))
