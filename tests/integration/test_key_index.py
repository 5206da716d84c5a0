"""The key index on real Delta tables: a lookup through it finds what a scan of
`slice_ids` finds, before and after maintenance adds runs, with a tail not yet
indexed, after a replay rewrote a slice's ids, and past a commit not by slice."""

from __future__ import annotations

import random
from datetime import date, timedelta

import pytest
from pyspark.sql import functions as F

from slicewise import key_index
from slicewise.config import load_settings
from slicewise.schemas import slice_ids_schema
from slicewise.tables import append_once, conform, replace_slice
from slicewise.windows import far_dates, scanned_far_dates

pytestmark = pytest.mark.integration

DAY0 = date(2026, 1, 1)
KEYS = 400  # each slice's keys, drawn from a pool a few times larger: copies recur


@pytest.fixture
def settings(tmp_path):
    return load_settings({"SLICEWISE_LAKEHOUSE": str(tmp_path / "lakehouse")})


def record(spark, settings, slice_id: str, rows: list[tuple[str, date]]) -> None:
    """The slice's ids as silver appends them (one commit naming the slice)."""
    schema = slice_ids_schema(settings.pipeline)
    df = spark.createDataFrame(
        [(slice_id, k, 1, d) for k, d in rows],
        "slice_id string, event_id string, copies long, event_date date",
    )
    append_once(
        conform(df, schema),
        settings.table("slice_ids"),
        f"slicewise/slice_ids/{slice_id}",
        {"step": "silver", "slice_id": slice_id},
    )


def slice_rows(rng: random.Random, n: int) -> list[tuple[str, date]]:
    pool = [f"k{i:05d}" for i in range(KEYS * 4)]
    return [(k, DAY0 + timedelta(days=rng.randrange(60))) for k in rng.sample(pool, n)]


def lookups_agree(spark, settings, rng: random.Random, tries: int = 1) -> list[tuple]:
    """Several slices' keys and windows, each looked up through the index and by a scan:
    the index must find every date the scan finds; returns both answers of each try."""
    answers = []
    for _ in range(tries):
        keys = [k for k, _ in slice_rows(rng, 60)] + ["never-recorded"]
        lo = DAY0 + timedelta(days=rng.randrange(60))
        window = (lo, lo + timedelta(days=2))
        frame = spark.createDataFrame([(k,) for k in keys], "event_id string")
        indexed = key_index.lookup(spark, settings, frame, window)
        scanned = scanned_far_dates(spark, settings, frame, window)
        answers.append((indexed, scanned))
    return answers


def test_a_lookup_through_the_index_finds_what_a_scan_finds(spark, settings):
    rng = random.Random(67)
    for s in range(4):
        record(spark, settings, f"s{s}", slice_rows(rng, KEYS))
    assert key_index.lookup(spark, settings, spark.range(1).select(F.lit("x").alias("event_id")),
                            (DAY0, DAY0)) is None  # fmt: skip  # no index yet: the caller scans

    built = key_index.refresh(spark, settings)
    assert built.rebuilt and built.keys > 0 and built.covers is not None
    for indexed, scanned in lookups_agree(spark, settings, rng):
        assert indexed == scanned and indexed  # copies recur: dates are found

    # Two more slices, not indexed yet (the tail), then a run of them.
    for s in range(4, 6):
        record(spark, settings, f"s{s}", slice_rows(rng, KEYS))
    for indexed, scanned in lookups_agree(spark, settings, rng):
        assert indexed == scanned
    run = key_index.refresh(spark, settings)
    assert not run.rebuilt and 0 < run.keys <= 2 * KEYS and run.covers > built.covers
    assert key_index.refresh(spark, settings).keys == 0  # nothing new: nothing written
    for indexed, scanned in lookups_agree(spark, settings, rng):
        assert indexed == scanned

    # A replay rewrites s1's ids at other dates: the index may find more, never less.
    moved = slice_rows(rng, KEYS)
    schema = slice_ids_schema(settings.pipeline)
    replace_slice(
        conform(
            spark.createDataFrame(
                [("s1", k, 1, d) for k, d in moved],
                "slice_id string, event_id string, copies long, event_date date",
            ),
            schema,
        ),
        settings.table("slice_ids"),
        "s1",
    )
    for indexed, scanned in lookups_agree(spark, settings, rng):
        assert set(scanned) <= set(indexed)  # the tail holds the replay's commit
    key_index.refresh(spark, settings)
    for indexed, scanned in lookups_agree(spark, settings, rng):
        assert set(scanned) <= set(indexed)  # a run holds it, beside the old pairs

    # A commit that names no slice: the lookup falls back to the scan, and the next
    # refresh rebuilds the index, which then holds exactly what `slice_ids` holds.
    stray = spark.createDataFrame(
        [("hand", "k00001", 1, DAY0 + timedelta(days=300))],
        "slice_id string, event_id string, copies long, event_date date",
    )
    conform(stray, schema).write.format("delta").mode("append").save(settings.table("slice_ids"))
    frame = spark.createDataFrame([("k00001",)], "event_id string")
    assert key_index.lookup(spark, settings, frame, (DAY0, DAY0)) is None
    assert DAY0 + timedelta(days=300) in far_dates(spark, settings, frame, (DAY0, DAY0))
    rebuilt = key_index.refresh(spark, settings)
    assert rebuilt.rebuilt
    for indexed, scanned in lookups_agree(spark, settings, rng):
        assert indexed == scanned
    assert DAY0 + timedelta(days=300) in key_index.lookup(spark, settings, frame, (DAY0, DAY0))


def test_a_run_is_sorted_by_key_in_small_pages(spark, settings, tmp_path):
    """What makes a lookup cost what its keys cost: each run's file sorted by key, its
    row groups and pages small enough for Parquet's statistics to skip most of them."""
    import pyarrow.parquet as pq

    rng = random.Random(7)
    rows = [(f"{rng.getrandbits(64):016x}", DAY0) for _ in range(30_000)]
    record(spark, settings, "big", rows)
    key_index.refresh(spark, settings)
    [run] = (tmp_path / "lakehouse").glob("**/key_index/run=*")
    [data] = run.glob("*.parquet")
    parquet = pq.ParquetFile(data)
    keys = parquet.read(columns=["event_id"]).column("event_id").to_pylist()
    assert keys == sorted(keys) and len(keys) == len(rows)
    assert all(parquet.metadata.row_group(g).column(0).has_column_index
               for g in range(parquet.metadata.num_row_groups))  # fmt: skip


def test_publications_add_the_tail_as_runs_merged_by_tier(spark, settings, monkeypatch):
    """A publication's flush adds the tail as a run once it holds FLUSH_SLICES slices,
    and merges FANOUT runs of a tier into one run of the next, cascading: the runs a
    lookup opens stay few, and it still finds what a scan finds."""
    monkeypatch.setattr(key_index, "FLUSH_SLICES", 1)
    monkeypatch.setattr(key_index, "FANOUT", 3)
    monkeypatch.setattr(key_index, "FIRST_TIER_KEYS", 150)  # tiers: 150, 450, 1,350 keys
    rng = random.Random(68)
    record(spark, settings, "s0", slice_rows(rng, KEYS))
    assert key_index.flush(spark, settings) is None  # no index yet: maintenance builds it
    key_index.refresh(spark, settings)  # one run of 400 keys: tier 1
    tiers = []
    for s in range(1, 7):
        record(spark, settings, f"s{s}", slice_rows(rng, 100))  # runs of tier 0
        done = key_index.flush(spark, settings)
        assert done is not None and not done.rebuilt and done.keys >= 100
        runs = key_index._runs(spark, settings.table(key_index.TABLE))
        tiers.append(sorted(r.tier for r in runs))
    # Three tier-0 runs became one of tier 1 (slice 3), three of tier 1 one of tier 2
    # (slice 6): no tier ever holds FANOUT runs after a flush.
    assert tiers[2] == [1, 1] and tiers[5] == [2], tiers
    assert all(t.count(n) < 3 for t in tiers for n in t), tiers
    for indexed, scanned in lookups_agree(spark, settings, rng):
        assert indexed == scanned and indexed


def scanned(df) -> int:
    """Rows the file scans of `df`'s query returned (Spark Connect's plan metrics)."""
    df.collect()
    return sum(
        int(m.value)
        for node in df.executionInfo.metrics._metrics
        if node.name.startswith("Scan")
        for m in node.metrics
        if m.name == "numOutputRows"
    )


def test_a_lookup_reads_what_its_keys_cost_not_what_the_history_holds(spark, settings):
    """The rows a lookup's scans read, at 10 slices and at 1,000 slices of 1,200 keys:
    through the index, bounded by its keys' pages (1,000 rows each); by a scan of
    `slice_ids`, every key ever recorded."""
    path = settings.table("slice_ids")
    window = (date(2026, 6, 1), date(2026, 6, 3))  # every recorded date lies outside

    def grow(first: int, last: int) -> None:
        """Slices first..last-1 of 1,200 md5 keys each, in one commit (a write by hand:
        the refresh then rebuilds the index from all of `slice_ids`)."""
        spark.range(first * 1200, last * 1200).select(
            F.concat(F.lit("s"), (F.col("id") / 1200).cast("long").cast("string")).alias(
                "slice_id"
            ),
            F.md5(F.col("id").cast("string")).alias("event_id"),
            F.lit(1).cast("long").alias("copies"),
            F.lit(DAY0).alias("event_date"),
        ).write.format("delta").mode("append").save(path)

    import hashlib

    recorded = [hashlib.md5(str(i * 997).encode()).hexdigest() for i in range(10)]
    keys = spark.createDataFrame([(k,) for k in recorded + ["new-1", "new-2"]], "event_id string")

    def rows_read() -> tuple[int, int]:
        key_index.refresh(spark, settings)
        through_index = key_index.found_pairs(spark, settings, keys, window)
        ids = spark.read.format("delta").load(path)
        by_scan = ids.where(~F.col("event_date").between(*window)).join(
            keys, "event_id", "left_semi"
        )
        return scanned(through_index.select("event_date")), scanned(by_scan.select("event_date"))

    grow(0, 10)
    index_at_10, scan_at_10 = rows_read()
    grow(10, 1000)
    index_at_1000, scan_at_1000 = rows_read()
    assert scan_at_10 == 12_000 and scan_at_1000 == 1_200_000  # the scan reads it all
    assert 0 < index_at_1000 <= max(index_at_10, 12 * 1_000), (index_at_10, index_at_1000)
