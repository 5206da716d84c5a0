"""The key index: where earlier slices recorded a copy of a slice's keys, looked up at a
cost that follows the slice and the index's tail, not every key the pipeline ever
recorded (DESIGN.md, *Cost*; issue 67).

`slice_ids` records each slice's keys by slice, one small append a slice; a lookup in
all of it reads every key ever recorded (linear: 0.055 s a million keys). The index
holds the same (key, event date) pairs sorted by key, in *runs*: a table partitioned
by `run`, each run range-partitioned and sorted by key in small row groups and pages.
A lookup's keys go down to Parquet as point predicates (IN lists of at most
`CHUNK`), whose statistics and column index keep only the pages that may hold one
of them (bench/results/NOTES.md, 2026-12-03: 0.65 s at 10 million keys, 0.87 s at
100 million, against 2.23 and 13.95 s for the scan).

Maintenance alone writes the index (`refresh`): the slices whose ids `slice_ids`
committed since the version the index covers (its property `COVERS`) become one
more run, sorted; past `MAX_RUNS` runs, or when the tail holds a commit whose slice
is unknown, it is rebuilt from all of `slice_ids`. A lookup reads the index and the
tail (the slices `slice_ids`' history names above `COVERS`, read by slice id), so
it misses nothing committed before it started, which is what the race between two
slices' lookups relies on (`windows.far_dates`). The index only grows between
rebuilds: a replay that rewrote a slice's ids leaves its old pairs, so a lookup may
find a date it does not need (its MERGE reads one partition more), never miss one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import date

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from slicewise.config import Settings
from slicewise.schemas import slice_ids_schema
from slicewise.tables import (
    delta_ref,
    history,
    read_table,
    retry_on_conflict,
    stored_table,
    table_properties,
)

log = logging.getLogger(__name__)

TABLE = "key_index"
COVERS = "slicewise.keyIndex.covers"  # the `slice_ids` version the index holds all of
CHUNK = 100  # keys per IN list: Spark turns each into an OR of equalities that Parquet
# tests page by page; above `spark.sql.parquet.pushdown.inFilterThreshold` it pushes a
# set that Parquet tests by its min and max only, and one list of 1,200 equalities
# overflowed a task's stack (NOTES, 2026-12-03)
POINT_KEYS = 10_000  # a slice with more keys joins the index instead (a scan of it)
TAIL_COMMITS = 1_000  # a longer tail than this is read as a scan of `slice_ids`
MAX_RUNS = 24  # past this many runs, the next refresh rebuilds the index as one
ROWS_PER_FILE = 4_000_000  # a run's files: few to open, row groups and pages small
RUN_WRITER = {  # Parquet writer settings of a run (session settings reach the writer)
    "parquet.block.size": str(4 * 1024 * 1024),
    "parquet.page.row.count.limit": "1000",
    "parquet.page.size": str(32 * 1024),
}
# Commits of `slice_ids` that change no row; any other commit must name its slice.
ROWLESS = {
    "OPTIMIZE",
    "VACUUM START",
    "VACUUM END",
    "SET TBLPROPERTIES",
    "UNSET TBLPROPERTIES",
    "ADD COLUMNS",
    "CHANGE COLUMN",
    "UPGRADE PROTOCOL",
    "REORG",
}


@dataclass(frozen=True)
class Tail:
    """`slice_ids`' commits above the index's: the slices they wrote, up to `version`."""

    version: int
    slices: tuple[str, ...]


def tail_of(commits: list[dict], since: int) -> Tail | None:
    """The tail from history rows (newest first, as DESCRIBE HISTORY gives them) that
    must reach back to the commit after `since`; None where they do not, or where a
    commit that may change rows names no slice (`userMetadata`'s `slice_id`)."""
    above = [c for c in commits if int(c["version"]) > since]
    if not above:
        return Tail(since, ())
    if min(int(c["version"]) for c in above) != since + 1:
        return None  # the history read does not reach back far enough
    slices = set()
    for c in above:
        if c["operation"] in ROWLESS:
            continue
        try:
            slice_id = json.loads(c["userMetadata"] or "{}").get("slice_id")
        except (json.JSONDecodeError, AttributeError):
            slice_id = None
        if not slice_id:
            return None
        slices.add(slice_id)
    return Tail(max(int(c["version"]) for c in above), tuple(sorted(slices)))


def read_tail(spark: SparkSession, settings: Settings, since: int) -> Tail | None:
    """`slice_ids`' tail above version `since` (None: too long or not by slice)."""
    path = settings.table("slice_ids")
    recent = 64
    while True:
        commits = [r.asDict() for r in history(spark, path, recent).collect()]
        tail = tail_of(commits, since)
        if tail is not None or len(commits) < recent or recent >= TAIL_COMMITS:
            return tail
        recent = min(recent * 4, TAIL_COMMITS)


def covered(spark: SparkSession, settings: Settings) -> int | None:
    """The `slice_ids` version the index holds all of; None without an index. (Its
    absence costs one analysis round trip, no DESCRIBE: most pipelines have none.)"""
    path = settings.table(TABLE)
    if stored_table(spark, path) is None:
        return None
    properties = table_properties(spark, path)
    if not properties or COVERS not in properties:
        return None
    return int(properties[COVERS])


def point_predicates(column: str, values: list) -> Column:
    """`column` among `values`, as an OR of IN lists of CHUNK values each."""
    chunks = [F.col(column).isin(values[i : i + CHUNK]) for i in range(0, len(values), CHUNK)]
    predicate = chunks[0]
    for chunk in chunks[1:]:
        predicate = predicate | chunk
    return predicate


def lookup(
    spark: SparkSession, settings: Settings, keys: DataFrame, window: tuple[date, date]
) -> tuple[date, ...] | None:
    """The event dates outside `window` where a slice recorded a copy of one of `keys`
    (what `windows.far_dates` answers), from the index and its tail; None when there is
    no index or its tail cannot be read by slice (the caller scans `slice_ids`)."""
    since = covered(spark, settings)
    if since is None:
        return None
    tail = read_tail(spark, settings, since)
    if tail is None:
        log.warning(
            "key index: slice_ids' commits since version %d are too many or not by slice; "
            "scanning slice_ids (maintenance rebuilds the index)",
            since,
        )
        return None
    key = list(settings.pipeline.key_columns)
    lo, hi = window
    outside = ~F.col("event_date").between(F.lit(lo), F.lit(hi))
    first = [r[0] for r in keys.select(key[0]).distinct().limit(POINT_KEYS + 1).collect()]
    if not first:
        return ()
    index = spark.read.format("delta").load(settings.table(TABLE)).where(outside)
    if len(first) <= POINT_KEYS:
        spark.conf.set("spark.sql.parquet.pushdown.inFilterThreshold", str(CHUNK))
        index = index.where(point_predicates(key[0], first))
    pairs = index.select(*key, "event_date")
    if tail.slices:
        ids = read_table(spark, settings.table("slice_ids"), slice_ids_schema(settings.pipeline))
        recent = ids.where(F.col("slice_id").isin(list(tail.slices))).where(outside)
        pairs = pairs.unionByName(recent.select(*key, "event_date"))
    rows = pairs.join(keys.select(*key), key, "left_semi").select("event_date").distinct()
    return tuple(sorted(r.event_date for r in rows.collect()))


@dataclass(frozen=True)
class Refreshed:
    covers: int | None  # the `slice_ids` version the index now holds all of
    rebuilt: bool  # written anew from all of `slice_ids` (else a run added, or nothing)
    keys: int  # pairs written


def refresh(spark: SparkSession, settings: Settings) -> Refreshed:
    """Add the slices `slice_ids` recorded since the index's version as one sorted run,
    or rebuild the index from all of `slice_ids` (none yet, a tail not by slice, or
    more than MAX_RUNS runs). Maintenance's, one at a time per pipeline; a run that
    loses a race to another refresh is retried on the new snapshot."""
    return retry_on_conflict(lambda: _refresh(spark, settings), "the key index's refresh")


def _refresh(spark: SparkSession, settings: Settings) -> Refreshed:
    path, source = settings.table(TABLE), settings.table("slice_ids")
    if stored_table(spark, source) is None:
        return Refreshed(None, False, 0)
    since = covered(spark, settings)
    tail = None if since is None else read_tail(spark, settings, since)
    runs = 0 if tail is None else _runs(spark, path)
    if tail is not None and runs < MAX_RUNS:
        if not tail.slices:
            return Refreshed(since, False, 0)
        rows = _as_of(spark, source, tail.version).where(F.col("slice_id").isin(list(tail.slices)))
        written = _write_run(
            spark, settings, rows, f"{since + 1:012d}-{tail.version:012d}", "append"
        )
        _set_covers(spark, path, tail.version)
        return Refreshed(tail.version, False, written)
    version = _latest(spark, source)
    written = _write_run(
        spark, settings, _as_of(spark, source, version), f"0-{version:012d}", "overwrite"
    )
    _set_covers(spark, path, version)
    return Refreshed(version, True, written)


def _latest(spark: SparkSession, path: str) -> int:
    return int(history(spark, path, 1).collect()[0]["version"])


def _as_of(spark: SparkSession, path: str, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def _runs(spark: SparkSession, path: str) -> int:
    table = stored_table(spark, path)
    return 0 if table is None else table.select("run").distinct().count()


def _write_run(spark: SparkSession, settings: Settings, ids: DataFrame, run: str, mode: str) -> int:
    """Write `ids`' (key, event date) pairs as the run `run`, sorted by key."""
    key = list(settings.pipeline.key_columns)
    pairs = ids.select(*key, "event_date").distinct().cache()
    try:
        count = pairs.count()
        files = max(1, -(-count // ROWS_PER_FILE))
        for name, value in RUN_WRITER.items():
            spark.conf.set(name, value)
        try:
            (
                pairs.repartitionByRange(files, *key)
                .sortWithinPartitions(*key)
                .withColumn("run", F.lit(run))
                .write.format("delta")
                .mode(mode)
                .partitionBy("run")
                .option("userMetadata", json.dumps({"step": "key_index", "run": run}))
                .save(settings.table(TABLE))
            )
        finally:
            for name in RUN_WRITER:
                spark.conf.unset(name)
    finally:
        pairs.unpersist()
    log.info("key index: run %s, %d key(s), %d file(s) (%s)", run, count, files, mode)
    return count


def _set_covers(spark: SparkSession, path: str, version: int) -> None:
    """Record, after the run committed, that the index holds `slice_ids` up to
    `version`: cut off between the two, the index only holds more than it says."""
    spark.sql(
        f"ALTER TABLE {delta_ref(path)} SET TBLPROPERTIES ('{COVERS}' = '{version}')"
    ).collect()
