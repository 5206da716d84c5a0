"""The lakehouse tables' Delta helpers shared by the steps (their schemas: `schemas`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import TypeVar

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

log = logging.getLogger(__name__)
T = TypeVar("T")


def delta_ref(path: str) -> str:
    """A table location as a SQL identifier (Delta through SQL works over Spark Connect too)."""
    return "delta.`" + path.replace("`", "``") + "`"


# What loading a location that holds no committed Delta table raises: no folder, a
# folder without a log, or one whose first commit is still being written.
NO_TABLE_CONDITIONS = ("PATH_NOT_FOUND", "DELTA_TABLE_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE")


def stored_table(spark: SparkSession, path: str) -> DataFrame | None:
    """The Delta table at `path`, or None when nothing was committed there yet.

    Resolving the table's schema is one analysis round trip over Spark Connect and no
    Spark job, where DESCRIBE DETAIL costs a command and a fetch (about 7x longer on a
    warm server): the steps check several tables each, hour after hour.
    """
    from pyspark.errors import AnalysisException

    try:
        table = spark.read.format("delta").load(path)
        table.schema  # noqa: B018 - Spark Connect resolves lazily; resolve it here
    except AnalysisException as exc:
        if exc.getCondition() in NO_TABLE_CONDITIONS:
            return None
        raise
    return table


def table_exists(spark: SparkSession, path: str) -> bool:
    return stored_table(spark, path) is not None


def table_properties(spark: SparkSession, path: str) -> dict[str, str] | None:
    """The table's properties (DESCRIBE DETAIL), or None when there is no table yet."""
    from pyspark.errors import AnalysisException

    try:
        detail = spark.sql(f"DESCRIBE DETAIL {delta_ref(path)}").first()
    except AnalysisException as exc:
        if exc.getCondition() == "DELTA_MISSING_DELTA_TABLE":
            return None
        raise
    return dict(detail["properties"] or {})


def append_once(df: DataFrame, path: str, app_id: str, metadata: dict) -> None:
    """Append `df` unless a write with `app_id` already committed to the table: Delta's
    idempotent writes, so a retried or racing attempt of a step appends nothing twice."""
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", 0)
        .option("userMetadata", json.dumps(metadata, sort_keys=True))
        .save(path)
    )


# Delta forgets an idempotent-write id once it is older than the table's
# `delta.setTransactionRetentionDuration` (maintenance sets it to `vacuum_retain`). Kept
# for ever, every id a table spent stays in its checkpoint, which each idempotent write
# reads whole: 0.8 s a small append at 20 ids, 3.6 s at 500,000 (bench/results/NOTES.md).
CLOCKS_APART = timedelta(hours=1)  # between the host that wrote an id and one reading it


def ids_may_be_forgotten(
    written_from: datetime, retain: timedelta, attempt: timedelta, now: datetime | None = None
) -> bool:
    """Whether a write starting `now` (committing within `attempt`) may find forgotten the
    ids of writes made at or after `written_from`: the rows, not the id, then tell whether
    an earlier write of the slice committed (`append_slice_once`)."""
    if written_from.tzinfo is None:
        written_from = written_from.replace(tzinfo=timezone.utc)
    now = now or datetime.now(timezone.utc)
    return now + attempt + CLOCKS_APART >= written_from + retain


def append_slice_once(
    df: DataFrame,
    path: str,
    schema: StructType,
    slice_id: str,
    app_id: str,
    metadata: dict,
    forgotten: bool,
) -> None:
    """`append_once` the slice's rows; where its id may be `forgotten`, nothing if the
    table holds rows of the slice already. (Two attempts racing both write under a fresh
    id, so Delta still lets one commit.)"""
    if forgotten and of_slice(df.sparkSession, path, schema, slice_id).limit(1).count():
        log.info("%s holds rows of slice %s already: not appended again", path, slice_id)
        return
    append_once(df, path, app_id, metadata)


def replace_slice(df: DataFrame, path: str, slice_id: str) -> None:
    """The slice's rows of a table become `df`'s (other slices' rows untouched). The
    commit names the slice, as an append's does (the key index reads it: `key_index`)."""
    (
        df.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"slice_id = '{slice_id}'")
        .option("userMetadata", json.dumps({"step": "replace", "slice_id": slice_id}))
        .save(path)
    )


def history(spark: SparkSession, path: str, recent: int) -> DataFrame:
    """The table's last `recent` commits, newest first (DESCRIBE HISTORY). Collect it and
    pick rows in Python: a `select`, `where` or `first()` on the command's result is one
    more Spark job (bench/results/NOTES.md, 2026-12-06, evening)."""
    return spark.sql(f"DESCRIBE HISTORY {delta_ref(path)} LIMIT {int(recent)}")


def latest_commit(spark: SparkSession, path: str) -> Row:
    """The history row of the table's latest commit."""
    return history(spark, path, 1).collect()[0]


def table_version(spark: SparkSession, path: str) -> int:
    return int(latest_commit(spark, path)["version"])


def read_table(spark: SparkSession, path: str, schema: StructType) -> DataFrame:
    """The table, or an empty frame of its schema when nothing was written yet."""
    table = stored_table(spark, path)
    return spark.createDataFrame([], schema) if table is None else table


def of_slice(spark: SparkSession, path: str, schema: StructType, slice_id: str) -> DataFrame:
    """A table's rows of one slice (Delta skips the other slices' files by their stats)."""
    return read_table(spark, path, schema).where(F.col("slice_id") == slice_id)


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """Select the schema's columns in order, cast to their types."""
    return df.select([df[f.name].cast(f.dataType).alias(f.name) for f in schema.fields])


def tagged_commit(spark: SparkSession, path: str, attempt: str, recent: int = 50) -> Row | None:
    """The history row of the commit that carries `attempt` in its userMetadata, among the
    table's last `recent` commits; None if there is none: a write with an idempotent-write
    id whose version was already committed returns normally without committing anything."""
    commits = history(spark, path, recent).collect()
    return next((c for c in commits if attempt in (c["userMetadata"] or "")), None)


def commit_metrics(spark: SparkSession, path: str, attempt: str, recent: int = 50) -> dict | None:
    """The operation metrics of the commit that carries `attempt` (`tagged_commit`)."""
    commit = tagged_commit(spark, path, attempt, recent)
    return None if commit is None else dict(commit["operationMetrics"] or {})


# Delta's commit conflicts, by error condition: over Spark Connect they arrive as
# generic Spark errors that carry the condition, not as delta.exceptions classes.
CONFLICT_CONDITIONS = ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")
CONFLICT_CLASSES = (
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
)


def is_commit_conflict(exc: BaseException) -> bool:
    """True if a concurrent Delta commit won the race `exc` reports."""
    condition = getattr(exc, "getCondition", lambda: None)() or ""
    if condition.startswith(CONFLICT_CONDITIONS):
        return True
    # The Connect client does not always rebuild the error's class: it may arrive as an
    # UnknownException whose message alone starts with "[DELTA_CONCURRENT_...]".
    message = str(exc)
    return (
        type(exc).__name__ in CONFLICT_CLASSES
        or any(message.startswith(f"[{c}") for c in CONFLICT_CONDITIONS)
        or any(f"io.delta.exceptions.{name}" in message for name in CONFLICT_CLASSES)
    )


def retry_on_conflict(
    step: Callable[[], T],
    what: str,
    attempts: int = 6,
    also: type[BaseException] | tuple[type[BaseException], ...] = (),
) -> T:
    """Run a step that is idempotent per slice, again if a concurrent writer won.

    Two attempts of one slice (a zombie driver and its retry) race on the same
    Delta commit; Delta lets exactly one win. The loser re-runs the step, which
    then finds the winner's commit (same idempotent-write id) and does nothing.
    Racers in lockstep can meet again at the step's next commit (silver creates its
    table, appends quarantine, then merges): every lost race means the other side
    committed, so the attempts are bounded by the step's commits, and 6 covers them.
    `also`: the step's own signs of a lost race (a write Delta skipped under a fence).
    """
    for attempt in range(1, attempts + 1):
        try:
            return step()
        except Exception as exc:
            if attempt == attempts or not (isinstance(exc, also) or is_commit_conflict(exc)):
                raise
            log.warning(
                "%s lost a commit race (%s); re-checking (attempt %d)",
                what,
                type(exc).__name__,
                attempt + 1,
            )
    raise AssertionError("unreachable")


def side_by_side(*steps: Callable[[], T]) -> list[T]:
    """Run independent Spark actions at once; their results in order.

    A write spends much of its time on the driver (planning, Delta's commit and log
    listing) while the cores idle; actions submitted together keep them busy. All run
    to the end before the first failure is raised, so no write is left half-watched.
    """
    with ThreadPoolExecutor(len(steps)) as pool:
        futures = [pool.submit(step) for step in steps]
    return [future.result() for future in futures]
