"""What silver's MERGE costs a slice by each path (issue 68): the probe and then the
insert-only MERGE (what `silver.merge_into_silver` did until 2026-12-04, kept here as the
baseline), against the full MERGE straight away (what it does now).

    .venv/bin/python bench/merge_paths.py [--events 1200 20000] [--merges 10] [--stored 20]

On a warm in-process session (`local[2]`, the product's `local_conf`), silver of the
example definition holding `--stored` slices of `--events` keys each, one event date.
Then `--merges` slices of new keys each way, alternating: the product's MERGE, and the
probe (a count of the stored copies the slice beats, at silver's version) followed by
the insert-only MERGE when it finds none (nothing is beaten here, so that path is at
its best). With `--beaten`, each slice also carries a better copy of one stored key
(the probe then finds it and the full MERGE follows it). Medians and Spark jobs per
slice, one JSON line per size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import date, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "include"))

from slicewise.contract import beats_sql, key_match_sql  # noqa: E402
from slicewise.pipelines import load_pipelines  # noqa: E402
from slicewise.schemas import silver_schema  # noqa: E402
from slicewise.silver import merge_into_silver  # noqa: E402
from slicewise.spark import get_spark, local_conf  # noqa: E402
from slicewise.tables import delta_ref, table_version  # noqa: E402
from slicewise.windows import Reach  # noqa: E402

DAY = date(2026, 11, 1)
AT = datetime(2026, 11, 1, 12)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, nargs="+", default=[1200, 20000])
    parser.add_argument("--merges", type=int, default=10)
    parser.add_argument("--beaten", action="store_true")
    parser.add_argument("--stored", type=int, default=20, help="slices in silver first")
    args = parser.parse_args()
    spark = get_spark(master="local[2]", extra_conf=local_conf())
    sc = spark.sparkContext
    events = load_pipelines()["events"]
    schema = silver_schema(events)
    reach = Reach((DAY, DAY))
    root = Path(tempfile.mkdtemp(prefix="merge-paths-"))

    def slice_of(n: int, size: int, beaten: bool) -> list[tuple]:
        rows = [
            (f"k{n}-{j}", "click", AT, "{}", DAY, n % 3, 1_000 + j, AT, f"s{n}")
            for j in range(size)
        ]
        if beaten:  # a copy of slice 0's first key at a lower position than its stored one
            rows.append(("k0-0", "click", AT, "{}", DAY, 0, 0, AT, f"s{n}"))
        return rows

    for size in args.events:
        path = str(root / f"silver-{size}")
        for n in range(args.stored):
            df = spark.createDataFrame(slice_of(n, size, False), schema)
            merge_into_silver(spark, path, events, df, reach, f"warm/{n}", f"s{n}")
        timed: dict[str, list[tuple[float, int]]] = {"probe_first": [], "full_merge": []}
        for n in range(100, 100 + 2 * args.merges):
            kind = "probe_first" if n % 2 else "full_merge"
            df = spark.createDataFrame(slice_of(n, size, args.beaten), schema).cache()
            df.count()
            group = f"{size}-{n}"
            sc.setJobGroup(group, group)
            started = time.perf_counter()
            if kind == "probe_first":
                probe_then_insert(spark, path, events, df, reach)
            else:
                merge_into_silver(spark, path, events, df, reach, f"m/{n}", f"s{n}")
            timed[kind].append(
                (time.perf_counter() - started, len(sc.statusTracker().getJobIdsForGroup(group)))
            )
            df.unpersist()
        print(
            json.dumps(
                {
                    "events": size,
                    "beaten": args.beaten,
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


def probe_then_insert(spark, path: str, pipeline, events, reach: Reach) -> None:
    """The former path: count the stored copies the slice beats at silver's version, then
    the insert-only MERGE when none is (else the full MERGE)."""
    events.createOrReplaceTempView("slice_events")
    on = f"{reach.sql('t.event_date')} AND {key_match_sql(pipeline)}"
    version = table_version(spark, path)
    beaten = spark.sql(
        f"SELECT count(*) FROM {delta_ref(path)} VERSION AS OF {version} AS t "
        f"JOIN slice_events AS s ON {on} WHERE {beats_sql(pipeline)}"
    ).first()[0]
    matched = f"WHEN MATCHED AND {beats_sql(pipeline)} THEN UPDATE SET * " if beaten else ""
    spark.sql(
        f"MERGE INTO {delta_ref(path)} AS t USING slice_events AS s ON {on} "
        f"{matched}WHEN NOT MATCHED THEN INSERT *"
    ).collect()
    table_version(spark, path)  # what the pin's check read back (its tagged commit)


if __name__ == "__main__":
    main()
