"""What the far-date lookup costs against the size of the history: a scan of `slice_ids`
against the key index (`slicewise.key_index`).

    .venv/bin/python bench/key_lookup.py --keys 1000000 10000000 100000000

For each history size N it writes a synthetic `slice_ids` of N random keys (md5 strings,
as UUID-like keys spread over the whole key space; a year of event dates; 1,200 keys a
slice), then times one slice's lookup of 1,200 keys (10 of them already recorded at
another date), median of `--repeat`:

- `scan`: the lookup without an index (`windows.scanned_far_dates`): the slice's keys
  joined left-semi against all of `slice_ids`, bin-packed by OPTIMIZE.
- `index`: the product's lookup (`key_index.lookup`) once maintenance's refresh built
  the index from that history: point predicates pushed down to the sorted run.
- `index_tail`: the same with `--runs` more runs added by publications' flushes (7 by
  default: the most tier 0 holds before a merge) and a tail of `--tail` slices recorded
  since (15 by default: the most before a flush), read by slice id.

All must find the same dates. Prints a table and writes bench/results/key-lookup.json.
A probe for issue 67, not a workload of `make bench`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

from pyspark.sql import functions as F

from slicewise import key_index
from slicewise.config import Settings, load_settings
from slicewise.connect_server import SparkConnectServer, warm_up
from slicewise.home import REPO_ROOT
from slicewise.spark import remote_session
from slicewise.tables import append_once
from slicewise.windows import scanned_far_dates
from slicewise_dev.broker import free_ports

SLICE = 1200
KNOWN = 10  # keys of the slice another slice already recorded (at another date)
WINDOW = ("2025-06-01", "2025-06-05")  # the slice's own dates, widened by the horizon


def history(spark, n: int):
    """N recorded keys: md5 strings, a year of event dates, 1,200 keys a slice."""
    return spark.range(n).select(
        F.concat(F.lit("slice-"), (F.col("id") / SLICE).cast("long").cast("string")).alias(
            "slice_id"
        ),
        F.md5(F.col("id").cast("string")).alias("event_id"),
        F.lit(1).cast("long").alias("copies"),
        F.date_add(F.lit("2025-01-01").cast("date"), (F.col("id") % 365).cast("int")).alias(
            "event_date"
        ),
    )


def write_history(spark, n: int, settings: Settings) -> None:
    """`slice_ids` holding N keys, compacted as maintenance leaves it."""
    path = settings.table("slice_ids")
    history(spark, n).write.format("delta").save(path)
    spark.sql(f"OPTIMIZE delta.`{path}`").collect()


def record_tail(spark, settings: Settings, slices: int, first: int = 0) -> None:
    """`slices` more slices of SLICE new keys each, appended one commit each as silver does."""
    for s in range(first, first + slices):
        rows = spark.range(SLICE).select(
            F.lit(f"tail-{s:04d}").alias("slice_id"),
            F.md5(F.concat(F.lit(f"tail-{s}-"), F.col("id").cast("string"))).alias("event_id"),
            F.lit(1).cast("long").alias("copies"),
            F.lit("2025-12-01").cast("date").alias("event_date"),
        )
        append_once(rows, settings.table("slice_ids"), f"slicewise/slice_ids/tail-{s}",
                    {"step": "silver", "slice_id": f"tail-{s:04d}"})  # fmt: skip


def slice_keys(n: int) -> list[str]:
    """1,200 keys: KNOWN recorded ones (ids spread over the history), the rest new."""
    import hashlib

    known = [hashlib.md5(str(i * (n // KNOWN)).encode()).hexdigest() for i in range(KNOWN)]
    new = [f"new-{i:06d}" for i in range(SLICE - KNOWN)]  # sorts apart from md5 hex
    return known + new


def lookup(spark, settings: Settings, keys: list[str], indexed: bool) -> list:
    mine = spark.createDataFrame([(k,) for k in keys], "event_id string")
    window = tuple(date.fromisoformat(d) for d in WINDOW)
    if not indexed:
        return list(scanned_far_dates(spark, settings, mine, window))
    found = key_index.lookup(spark, settings, mine, window)
    assert found is not None, "no key index"
    return list(found)


def timed(spark, settings, keys: list[str], indexed: bool, repeat: int) -> tuple[float, list]:
    """The median seconds of `repeat` lookups, after one to warm the snapshot and footers."""
    found = lookup(spark, settings, keys, indexed)
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        found = lookup(spark, settings, keys, indexed)
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds), found


def table_size(spark, path: str) -> dict:
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    return {"files": int(detail["numFiles"]), "bytes": int(detail["sizeInBytes"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runs", type=int, default=7, help="runs flushed after the build")
    parser.add_argument("--tail", type=int, default=15, help="slices recorded since the last run")
    parser.add_argument("--remote", help="an existing Spark Connect server (sc://...)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench/results/key-lookup.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slicewise-key-lookup-"))
    server = None
    url = args.remote
    if url is None:
        (port,) = free_ports(1)
        server = SparkConnectServer(work / "spark-connect", port, "local[*]")
        server.start()
        warm_up(server.url, server.home)
        url = server.url
    try:
        spark = remote_session(url, "key-lookup", fresh=True)
        results = []
        for n in args.keys:
            settings = load_settings({"SLICEWISE_LAKEHOUSE": str(work / f"lakehouse-{n}")})
            write_history(spark, n, settings)
            keys = slice_keys(n)
            row: dict = {"keys": n, "runs_flushed": args.runs, "tail_slices": args.tail}
            began = time.perf_counter()
            built = key_index.refresh(spark, settings)
            row["index_build_s"] = time.perf_counter() - began
            row["scan"], scanned = timed(spark, settings, keys, False, args.repeat)
            row["index"], indexed = timed(spark, settings, keys, True, args.repeat)
            for r in range(args.runs):
                record_tail(spark, settings, key_index.FLUSH_SLICES, r * key_index.FLUSH_SLICES)
                assert key_index.flush(spark, settings).keys > 0
            record_tail(spark, settings, args.tail, args.runs * key_index.FLUSH_SLICES)
            row["index_tail"], tailed = timed(spark, settings, keys, True, args.repeat)
            row["slice_ids_table"] = table_size(spark, settings.table("slice_ids"))
            row["index_table"] = table_size(spark, settings.table(key_index.TABLE))
            row["index_keys"] = built.keys
            assert scanned == indexed == tailed, (scanned, indexed, tailed)
            row["dates_found"] = len(scanned)
            results.append(row)
            print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps({"slice_keys": SLICE, "results": results}, indent=1))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
