"""What the far-date lookup costs against the size of the history, per key layout.

    .venv/bin/python bench/key_lookup.py --keys 1000000 10000000 100000000

For each history size N it writes a synthetic `slice_ids` of N random keys (md5 strings,
as UUID-like keys spread over the whole key space; a year of event dates; 1,200 keys a
slice) in two layouts, then times one slice's lookup of 1,200 keys (10 of them already
recorded at another date) in each, median of `--repeat`:

- `scan`: today's layout and query (`windows.far_dates`): the table bin-packed, the
  slice's keys joined left-semi against all of it.
- `sorted`: the keys sorted across files (range-partitioned), small row groups and
  pages, and the slice's keys pushed down as point predicates (IN lists of 100, which
  Spark turns into ORs of equalities at `spark.sql.parquet.pushdown.inFilterThreshold`), so
  Parquet's row-group statistics and column index keep only the pages that may hold
  one of them.

All must find the same dates; `sorted_unpushed` is the sorted layout's query with
Parquet's filter pushdown off, to show what the statistics and column index save. Prints a table and writes bench/results/key-lookup.json.
A probe for issue 67's choice of structure, not a workload of `make bench`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from datetime import date
from functools import partial
from pathlib import Path

from pyspark.sql import functions as F

from slicewise.config import Settings, load_settings
from slicewise.connect_server import SparkConnectServer, warm_up
from slicewise.home import REPO_ROOT
from slicewise.spark import remote_session
from slicewise.windows import far_dates
from slicewise_dev.broker import free_ports

SLICE = 1200
KNOWN = 10  # keys of the slice another slice already recorded (at another date)
WINDOW = ("2025-06-01", "2025-06-05")  # the slice's own dates, widened by the horizon
SORTED_WRITE = {  # Parquet writer settings of the sorted layout (session confs reach it)
    "parquet.block.size": str(4 * 1024 * 1024),
    "parquet.page.row.count.limit": "1000",
    "parquet.page.size": str(32 * 1024),
}


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


def write_layouts(spark, n: int, settings: Settings) -> dict[str, str]:
    """Today's layout where the product reads `slice_ids`, and the sorted one beside it."""
    scan, ordered = settings.table("slice_ids"), settings.table(f"slice_ids_sorted_{n}")
    history(spark, n).write.format("delta").save(scan)
    spark.sql(f"OPTIMIZE delta.`{scan}`").collect()
    files = max(1, n // 5_000_000)
    for key, value in SORTED_WRITE.items():
        spark.conf.set(key, value)
    try:
        (
            history(spark, n)
            .repartitionByRange(files, "event_id")
            .sortWithinPartitions("event_id")
            .write.format("delta")
            .save(ordered)
        )
    finally:
        for key in SORTED_WRITE:
            spark.conf.unset(key)
    return {"scan": scan, "sorted": ordered}


def slice_keys(n: int) -> list[str]:
    """1,200 keys: KNOWN recorded ones (ids spread over the history), the rest new."""
    import hashlib

    known = [hashlib.md5(str(i * (n // KNOWN)).encode()).hexdigest() for i in range(KNOWN)]
    new = [f"new-{i:06d}" for i in range(SLICE - KNOWN)]  # sorts apart from md5 hex
    return known + new


def lookup_scan(spark, settings: Settings, keys: list[str]) -> list:
    """Today's lookup: the product's own `windows.far_dates`."""
    mine = spark.createDataFrame([(k,) for k in keys], "event_id string")
    window = tuple(date.fromisoformat(d) for d in WINDOW)
    return list(far_dates(spark, settings, mine, window))


CHUNK = 100  # keys per IN list: Spark turns each into an OR of equalities, left-deep,
# and Parquet's filters recurse over it (one list of 1,200 overflowed a task's stack)


def point_predicates(keys: list[str]):
    """The keys as an OR of IN lists of CHUNK keys each, every one pushed to Parquet."""
    chunks = [F.col("event_id").isin(keys[i : i + CHUNK]) for i in range(0, len(keys), CHUNK)]
    predicate = chunks[0]
    for chunk in chunks[1:]:
        predicate = predicate | chunk
    return predicate


def lookup_sorted(spark, path: str, keys: list[str], pushdown: bool = True) -> list:
    lo, hi = WINDOW
    spark.conf.set("spark.sql.parquet.pushdown.inFilterThreshold", str(CHUNK))
    spark.conf.set("spark.sql.parquet.filterPushdown", str(pushdown).lower())
    try:
        rows = (
            spark.read.format("delta")
            .load(path)
            .where(point_predicates(keys))
            .where(~F.col("event_date").between(F.lit(lo), F.lit(hi)))
            .select("event_date")
            .distinct()
            .collect()
        )
    finally:
        spark.conf.unset("spark.sql.parquet.pushdown.inFilterThreshold")
        spark.conf.unset("spark.sql.parquet.filterPushdown")
    return sorted(r.event_date for r in rows)


def timed(lookup, spark, where, keys: list[str], repeat: int) -> tuple[float, list]:
    """The median seconds of `repeat` lookups, after one to warm the snapshot and footers."""
    found = lookup(spark, where, keys)
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        found = lookup(spark, where, keys)
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds), found


def table_size(spark, path: str) -> dict:
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    return {"files": int(detail["numFiles"]), "bytes": int(detail["sizeInBytes"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=3)
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
            paths = write_layouts(spark, n, settings)
            keys = slice_keys(n)
            row: dict = {"keys": n}
            found = {}
            lookups = {
                "scan": (settings, lookup_scan),
                "sorted": (paths["sorted"], lookup_sorted),
                # the sorted table's query with Parquet's filters off: what the pushdown saves
                "sorted_unpushed": (paths["sorted"], partial(lookup_sorted, pushdown=False)),
            }
            for name, (where, lookup) in lookups.items():
                row[name], found[name] = timed(lookup, spark, where, keys, args.repeat)
            for layout, path in paths.items():
                row[f"{layout}_table"] = table_size(spark, path)
            assert found["scan"] == found["sorted"] == found["sorted_unpushed"], found
            row["dates_found"] = len(found["scan"])
            results.append(row)
            print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps({"slice_keys": SLICE, "results": results}, indent=1))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
