"""The key index: where earlier slices recorded a copy of a slice's keys, looked up at a
cost that follows the slice and the index's tail, not every key the pipeline ever
recorded (DESIGN.md, *Cost*; issue 67).

`slice_ids` records each slice's keys by slice, one small append a slice; a lookup in
all of it reads every key ever recorded (linear: 0.055 s a million keys). The index
holds the same (key, event date) pairs sorted by key, in *runs*: a table partitioned
by `run`, each run range-partitioned and sorted by key in small row groups and pages,
and named by the `slice_ids` versions it holds and its number of pairs, so that the
runs and their sizes are read off the table's file list, not counted.
A lookup's keys go down to Parquet as point predicates (IN lists of at most
`CHUNK`), whose statistics and column index keep only the pages that may hold one
of them (bench/results/NOTES.md, 2026-12-03: 0.65 s at 10 million keys, 0.87 s at
100 million, against 2.23 and 13.95 s for the scan).

Runs are written as an LSM tree writes them. Publication, once its slice is
published, adds the slices `slice_ids` recorded since the index's version as a run
when they are `FLUSH_SLICES` or more (`flush`), and merges runs of a tier into one
of the next, up to `STEP_MERGE_KEYS`; maintenance does the bigger merges, and builds
the index where there is none or where the tail holds a commit whose slice is unknown
(`refresh`). Each of the index's commits records in its userMetadata the `slice_ids`
version it holds all of (`covers`). A lookup reads the runs and the tail: the slices
`slice_ids`' history names above that version, read by slice id. So it misses
nothing committed before it started, which the race between two slices' lookups
relies on (`windows.far_dates`), and it opens about `FANOUT` runs a tier and at most
`FLUSH_SLICES` tail slices, whatever the history. The index only grows between
rebuilds: a replay that rewrote a slice's ids leaves its old pairs, so a lookup may
find a date it does not need (its MERGE reads one partition more), never miss one.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import date

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from slicewise.config import Settings
from slicewise.schemas import slice_ids_schema
from slicewise.tables import (
    history,
    read_table,
    retry_on_conflict,
    stored_table,
    table_version,
)

log = logging.getLogger(__name__)

TABLE = "key_index"
CHUNK = 100  # keys per IN list: Spark turns each into an OR of equalities that Parquet
# tests page by page; above `spark.sql.parquet.pushdown.inFilterThreshold` it pushes a
# set that Parquet tests by its min and max only, and one list of 1,200 equalities
# overflowed a task's stack (NOTES, 2026-12-03)
POINT_KEYS = 10_000  # a slice with more keys joins the index instead (a scan of it)
TAIL_COMMITS = 1_000  # a longer tail than this is read as a scan of `slice_ids`
FLUSH_SLICES = 16  # a publication adds the tail as a run once it holds this many slices
FANOUT = 8  # runs of one tier merged into one run of the next
FIRST_TIER_KEYS = 50_000  # runs up to this size are tier 0; each tier FANOUT times larger
STEP_MERGE_KEYS = 2_000_000  # the merges a publication may make; larger ones: maintenance
RECENT_COMMITS = 20  # the index's commits read for its `covers` (a maintenance run adds 3)
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
    """The `slice_ids` version the index holds all of (`covers`, in its newest commit
    of a run: maintenance's VACUUM and properties commit after it); None without an
    index. (Its absence costs one analysis round trip: most pipelines have none until
    maintenance first runs.)"""
    path = settings.table(TABLE)
    if stored_table(spark, path) is None:
        return None
    for commit in history(spark, path, RECENT_COMMITS).collect():
        try:
            return int(json.loads(commit["userMetadata"] or "{}")["covers"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return None


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
    found = found_pairs(spark, settings, keys, window)
    if found is None:
        return None
    # No DISTINCT: the rows found are few (a key's copies), and a shuffle is a job more.
    return tuple(sorted({r.event_date for r in found.select("event_date").collect()}))


def found_pairs(
    spark: SparkSession, settings: Settings, keys: DataFrame, window: tuple[date, date]
) -> DataFrame | None:
    """`lookup`'s query: the (key, event date) pairs of `keys` outside `window` in the
    index and its tail, not yet run; None where `lookup` answers None."""
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
    index = spark.read.format("delta").load(settings.table(TABLE)).where(outside)
    if not first:
        return index.select(*key, "event_date").limit(0)
    ids = read_table(spark, settings.table("slice_ids"), slice_ids_schema(settings.pipeline))
    recent = ids.where(F.col("slice_id").isin(list(tail.slices))).where(outside)
    if len(first) <= POINT_KEYS:
        spark.conf.set("spark.sql.parquet.pushdown.inFilterThreshold", str(CHUNK))
        points = point_predicates(key[0], first)
        index, recent = index.where(points), recent.where(points)
    pairs = index.select(*key, "event_date")
    if tail.slices:
        pairs = pairs.unionByName(recent.select(*key, "event_date"))
    if len(key) > 1 or len(first) > POINT_KEYS:  # the points name the key's first column
        pairs = pairs.join(keys.select(*key), key, "left_semi")
    return pairs


@dataclass(frozen=True)
class Refreshed:
    covers: int | None  # the `slice_ids` version the index now holds all of
    rebuilt: bool  # written anew from all of `slice_ids`
    keys: int  # pairs written: the tail's run, the merges', or the rebuild's


@dataclass(frozen=True)
class Run:
    # The partition: the `slice_ids` versions it holds and its pairs, "<from>-<to>-<keys>".
    name: str
    keys: int

    @property
    def span(self) -> tuple[int, int]:
        low, high = self.name.split("-")[:2]
        return int(low), int(high)

    @property
    def tier(self) -> int:
        tier, size = 0, FIRST_TIER_KEYS
        while self.keys > size:
            tier, size = tier + 1, size * FANOUT
        return tier


def run_name(low: int, high: int, keys: int) -> str:
    return f"{low:012d}-{high:012d}-{keys}"


def keys_named(name: str) -> int | None:
    """A run's pairs as its name holds them; None for a run named before names held them."""
    parts = name.split("-")
    return int(parts[2]) if len(parts) == 3 else None


def refresh(spark: SparkSession, settings: Settings) -> Refreshed:
    """Maintenance's: the tail added as a run and every tier merged, or the index built
    from all of `slice_ids` where there is none or its tail is not by slice. A write
    that loses a race to another is retried on the new snapshot."""
    done = retry_on_conflict(
        lambda: _refresh(spark, settings, build=True, flush_from=1, merge_keys=None),
        "the key index's refresh",
    )
    return done or Refreshed(None, False, 0)


def flush(spark: SparkSession, settings: Settings) -> Refreshed | None:
    """A publication's: where an index exists and its tail holds FLUSH_SLICES slices or
    more, the tail added as a run, and tiers merged up to STEP_MERGE_KEYS. Best effort:
    the lookup is exact without it (a longer tail), so a failure is logged, not raised."""
    try:
        return retry_on_conflict(
            lambda: _refresh(
                spark, settings, build=False, flush_from=FLUSH_SLICES, merge_keys=STEP_MERGE_KEYS
            ),
            "the key index's flush",
        )
    except Exception as exc:  # noqa: BLE001 - an optimisation; maintenance catches up
        log.warning("key index: the tail was not added as a run (%s); maintenance will", exc)
        return None


def _refresh(
    spark: SparkSession,
    settings: Settings,
    build: bool,
    flush_from: int,
    merge_keys: int | None,
) -> Refreshed | None:
    source = settings.table("slice_ids")
    if stored_table(spark, source) is None:
        return None
    since = covered(spark, settings)
    tail = None if since is None else read_tail(spark, settings, since)
    if tail is None:
        if not build:
            return None
        version = table_version(spark, source)
        rows = _as_of(spark, source, version)
        written = _write_run(spark, settings, rows, (0, version), version, replacing=ALL)
        return Refreshed(version, True, written)
    assert since is not None
    written, covers = 0, since
    if not tail.slices:
        covers = tail.version  # only commits that change no row since: held already
    elif len(tail.slices) >= flush_from:
        rows = _as_of(spark, source, tail.version).where(F.col("slice_id").isin(list(tail.slices)))
        written += _write_run(spark, settings, rows, (since + 1, tail.version), tail.version)
        covers = tail.version
    # Tiers change only when a run is added: a flush that added none does not look.
    if written or merge_keys is None:
        written += _merge_tiers(spark, settings, covers, merge_keys)
    return Refreshed(covers, False, written)


def _merge_tiers(spark: SparkSession, settings: Settings, covers: int, limit: int | None) -> int:
    """Merge the runs of the lowest tier that holds FANOUT of them into one, again until
    no tier does (or the next merge would write more than `limit` keys)."""
    written = 0
    while True:
        runs = _runs(spark, settings.table(TABLE))
        by_tier: dict[int, list[Run]] = {}
        for run in runs:
            by_tier.setdefault(run.tier, []).append(run)
        full = [group for _, group in sorted(by_tier.items()) if len(group) >= FANOUT]
        if not full:
            return written
        group = full[0]
        keys = sum(r.keys for r in group)
        if limit is not None and keys > limit:
            return written
        spans = [r.span for r in group]
        index = spark.read.format("delta").load(settings.table(TABLE))
        rows = index.where(F.col("run").isin([r.name for r in group]))
        span = (min(lo for lo, _ in spans), max(hi for _, hi in spans))
        written += _write_run(spark, settings, rows, span, covers, replacing=group)


def _as_of(spark: SparkSession, path: str, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def _runs(spark: SparkSession, path: str) -> list[Run]:
    """The index's runs and their sizes, from its file list (the snapshot's metadata).
    Counting them read the whole index, 2.2 s at a month of one-minute slices; only runs
    named before their names held their size are still counted."""
    table = stored_table(spark, path)
    if table is None:
        return []
    names = {m.group(1) for f in table.inputFiles() if (m := _RUN_FOLDER.search(f))}
    named = {n: keys_named(n) for n in names}
    unnamed = [n for n, keys in named.items() if keys is None]
    if unnamed:
        counts = table.where(F.col("run").isin(unnamed)).groupBy("run").count().collect()
        named.update({r["run"]: int(r["count"]) for r in counts})
    return [Run(n, keys) for n, keys in named.items() if keys is not None]


_RUN_FOLDER = re.compile(r"/run=([0-9-]+)/")


ALL: list[Run] = []  # `_write_run`'s `replacing` for a build: in place of every run


def _write_run(
    spark: SparkSession,
    settings: Settings,
    ids: DataFrame,
    span: tuple[int, int],
    covers: int,
    replacing: list[Run] | None = None,
) -> int:
    """Write `ids`' (key, event date) pairs as the run of `slice_ids`' versions `span`
    (named with its number of pairs too), sorted by key: added
    (`replacing` None), in place of the runs `replacing` (a merge), or in place of
    every run (`ALL`: a build). Its commit records `covers`. Nothing is written for
    no pairs but by a build (an empty append commits nothing in Delta anyway)."""
    key = list(settings.pipeline.key_columns)
    pairs = ids.select(*key, "event_date").distinct().cache()
    try:
        count = pairs.count()
        if count == 0 and replacing is None:
            return 0
        run = run_name(*span, count)
        files = max(1, -(-count // ROWS_PER_FILE))
        metadata = {"step": "key_index", "run": run, "covers": covers}
        writer = (
            pairs.repartitionByRange(files, *key)
            .sortWithinPartitions(*key)
            .withColumn("run", F.lit(run))
            .write.format("delta")
            .partitionBy("run")
            .option("userMetadata", json.dumps(metadata))
        )
        if replacing is None:
            writer = writer.mode("append")
        elif replacing is ALL:
            writer = writer.mode("overwrite")
        else:
            # The predicate holds the written rows too (Delta refuses rows outside it).
            listed = ", ".join(f"'{name}'" for name in sorted({run, *(r.name for r in replacing)}))
            writer = writer.mode("overwrite").option("replaceWhere", f"run IN ({listed})")
        for name, value in RUN_WRITER.items():
            spark.conf.set(name, value)
        try:
            writer.save(settings.table(TABLE))
        finally:
            for name in RUN_WRITER:
                spark.conf.unset(name)
    finally:
        pairs.unpersist()
    log.info("key index: run %s, %d key(s), %d file(s)", run, count, files)
    return count
