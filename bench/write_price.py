"""What a small append to Delta costs with and without an idempotent-write id, and how
that grows with the ids a table has spent (issues 67 and 68).

    .venv/bin/python bench/write_price.py [--ids 0 100000] [--writes 10] [--retain-days 7]

On a warm in-process session (`local[2]`, the product's `local_conf`), for each count
of spent ids: a table of 20 small appends, then (when the count is above 0) one commit
written by hand holding that many `txn` actions (as that many slices' appends would
have left them; Delta's own writer puts one in each commit), and 10 appends more so a
checkpoint carries them (with `--retain-days`, the hand-written ids are 30 days old and
the table sets `delta.setTransactionRetentionDuration` to that many days, so Delta may
expire them). Then `--writes` appends of 50 rows each way, alternating: with
a fresh `txnAppId` (what `tables.append_once` does) and without. Medians, and the Spark
jobs each write ran. Prints one JSON line per count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "include"))

from slicewise.spark import get_spark, local_conf  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ids", type=int, nargs="+", default=[0, 100_000])
    parser.add_argument("--writes", type=int, default=10)
    parser.add_argument("--retain-days", type=int, default=None)
    args = parser.parse_args()
    spark = get_spark(master="local[2]", extra_conf=local_conf())
    sc = spark.sparkContext
    root = Path(tempfile.mkdtemp(prefix="write-price-"))

    def append(path: str, n: int, app_id: str | None) -> tuple[float, int]:
        group = f"{path}-{n}-{app_id}"
        sc.setJobGroup(group, group)
        rows = [(f"k{n}-{j}", j, f"s{n}") for j in range(50)]
        started = time.perf_counter()
        writer = spark.createDataFrame(rows, "event_id string, n long, slice_id string").write
        writer = writer.format("delta").mode("append")
        if app_id:
            writer = writer.option("txnAppId", app_id).option("txnVersion", 0)
        writer.save(path)
        return time.perf_counter() - started, len(sc.statusTracker().getJobIdsForGroup(group))

    for ids in args.ids:
        path = str(root / f"ids-{ids}")
        for n in range(20):
            append(path, n, f"warm/{n}")
        if args.retain_days is not None:
            spark.sql(
                f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                f"('delta.setTransactionRetentionDuration' = 'interval {args.retain_days} days')"
            )
        if ids:
            spend(Path(path), ids, days_ago=0 if args.retain_days is None else 30)
            for n in range(20, 30):
                append(path, n, None)
        timed: dict[str, list[tuple[float, int]]] = {"with_id": [], "without": []}
        for n in range(100, 100 + args.writes):
            timed["with_id"].append(append(path, n, f"measured/{n}"))
            timed["without"].append(append(path, 1000 + n, None))
        print(
            json.dumps(
                {
                    "spent_ids": ids + 20,
                    "retain_days": args.retain_days,
                    "checkpoint_bytes": checkpoint_bytes(Path(path)),
                    **{
                        f"{kind}_s": round(statistics.median(t for t, _ in runs), 3)
                        for kind, runs in timed.items()
                    },
                    **{
                        f"{kind}_jobs": statistics.median(j for _, j in runs)
                        for kind, runs in timed.items()
                    },
                }
            ),
            flush=True,
        )


def spend(table: Path, ids: int, days_ago: int = 0) -> None:
    """One commit with `ids` txn actions, as that many idempotent appends leave them
    (`days_ago`: when they were last updated)."""
    log = table / "_delta_log"
    version = max(int(p.name[:20]) for p in log.glob("*.json")) + 1
    now = int((time.time() - days_ago * 86_400) * 1000)
    lines = [json.dumps({"commitInfo": {"timestamp": now, "operation": "WRITE"}})]
    lines += [
        json.dumps({"txn": {"appId": f"spent/{i}", "version": 0, "lastUpdated": now}})
        for i in range(ids)
    ]
    (log / f"{version:020d}.json").write_text("\n".join(lines) + "\n")


def checkpoint_bytes(table: Path) -> int:
    checkpoints = sorted((table / "_delta_log").glob("*.checkpoint*.parquet"))
    return checkpoints[-1].stat().st_size if checkpoints else 0


if __name__ == "__main__":
    main()
