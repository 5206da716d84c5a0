"""The long-haul benchmark: does a slice cost the same after a long history as at first?

    make bench-longhaul                     # one-minute slices, histories of a day, a week
                                            # and a month, local then on s3proxy
    .venv/bin/python bench/longhaul.py --points 1440 10080 --stores local

Per store (a local folder; s3proxy, the tests' S3-compatible server, for tables and
ledger), one pipeline of one-minute slices of `--records` (1,200) records on a real
broker and a warm Spark Connect server:

1. `2 x --measured` (10) slices go through the real steps (plan, ingest, gate, publish,
   and `status --last 10`), each timed, its ledger calls counted; the second half are
   the baseline ("slice 10").
2. For each growth point in `--points` (slices of history), the history up to it is
   grown in bulk (`grow`) as the steps grow it, then maintenance runs once (the daily
   maintenance DAG's work on that history: compaction, retention properties, VACUUM,
   the key index), then one warm-up and `--measured` slices go through the real steps.
   The bulk history, per slice: its boundary, slice and step records in the ledger;
   `--records` rows in bronze, silver (partitioned by event date) and `slice_ids`, one
   in quarantine; and one idempotent-write id in each of bronze, quarantine,
   `slice_ids` and silver, last updated at the slice's end. What differs from the
   steps' own writes: one commit per table per block, not four a slice (the log is
   read from its checkpoint either way), files cut by size rather than per slice, no
   gold rows (the real slices rebuild their hours) and no GX results (the Data Docs
   keep the newest 100 whatever the history: `gx_adapter.KEPT_RESULTS`).

Writes bench/results/longhaul-<store>.json and a plot, longhaul.png; prints each step's
median at each point over its median at slice 10 (target <= 1.2), and the line fitted
to each step's medians against the keys in `slice_ids`, read off at a year of
one-minute slices.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

import slicewise.ledger
from slicewise.cli import shown_slices, status_freshness, status_rows
from slicewise.config import Settings, load_settings
from slicewise.connect_server import SparkConnectServer, warm_up
from slicewise.gate import run_gate
from slicewise.home import REPO_ROOT
from slicewise.ingest import run_ingest
from slicewise.ledger import Ledger
from slicewise.maintenance import run_maintenance
from slicewise.planner import plan_slice
from slicewise.publish import run_publish
from slicewise.schemas import BRONZE, QUARANTINE
from slicewise.slices import Boundary, slice_between, stamp
from slicewise.spark import remote_session
from slicewise.store import open_store
from slicewise.tables import delta_ref, table_exists, table_version
from slicewise_dev.broker import free_ports, running_broker
from slicewise_dev.counting_store import CountingStore
from slicewise_dev.producer import Record, TxProducer, event_value
from slicewise_dev.s3 import LocalS3

RESULTS = REPO_ROOT / "bench" / "results"
PARTITIONS = 3
TARGET = 1.2
STEPS = ("plan", "ingest", "gate", "publish", "status")
YEAR = 525_600  # one-minute slices
GROWN = ("bronze", "quarantine", "slice_ids", "silver")  # each holds one id per slice
ROWS_PER_FILE = 2_000_000  # the bulk history's files (~50 MB of bronze)


STORES: list[CountingStore] = []
_open_store = slicewise.ledger.open_store
slicewise.ledger.open_store = lambda location: (
    STORES.append(  # type: ignore[assignment]
        CountingStore(_open_store(location))
    )
    or STORES[-1]
)


def ledger_calls() -> int:
    return sum(sum(s.calls.values()) for s in STORES)


def records(at: datetime, width: timedelta, n: int) -> list[Record]:
    step, tag = width / n, f"r{at:%Y%m%d%H%M}"
    return [
        Record(event_value(f"{tag}-{i}", at + i * step), i % PARTITIONS, at + i * step)
        for i in range(n)
    ]


def timed(action: Callable[[], Any]) -> tuple[float, int]:
    """Seconds and ledger calls of one action."""
    calls, began = ledger_calls(), time.perf_counter()
    action()
    return time.perf_counter() - began, ledger_calls() - calls


def real_slice(
    spark, settings: Settings, producer: TxProducer, at: datetime, width: timedelta, n: int
) -> dict:
    """One slice through the real steps, each timed and its ledger calls counted."""
    producer.send(records(at, width, n))
    row: dict[str, Any] = {}
    planned: list = []
    later = datetime.now(timezone.utc) + timedelta(days=1)
    steps: dict[str, Callable[[], Any]] = {
        "plan": lambda: planned.append(plan_slice(settings, at, at + width, now=later)),
        "ingest": lambda: run_ingest(spark, settings, planned[0].slice_id),
        "gate": lambda: run_gate(spark, settings, planned[0].slice_id),
        "publish": lambda: run_publish(spark, settings, planned[0].slice_id),
        "status": lambda: status(settings, last=10),
    }
    for step, action in steps.items():
        row[step], row[f"{step}_ledger_calls"] = timed(action)
    return row


def status(settings: Settings, last: int) -> None:
    """What `slicewise status --last N` does, without printing: the same N slices shown
    early and late (the default 24 would show fewer at first)."""
    ledger = Ledger.of(settings)
    rows = status_rows(ledger, shown_slices(ledger, last, None, None))
    status_freshness(settings, ledger, rows)


def grow(spark, settings: Settings, first: datetime, count: int, width: timedelta, n: int) -> None:
    """`count` consecutive slices of history from `first`, in bulk, as the steps would
    have left them (the module's docstring says what differs)."""
    ledger = Ledger.of(settings)
    newest = ledger.newest_boundary()
    offsets = dict(newest.offsets) if newest else {p: 0 for p in range(PARTITIONS)}
    rows = history_rows(spark, first, count, width, n)
    schemas = {
        "bronze": BRONZE,
        "quarantine": QUARANTINE,
        **{
            table: spark.read.format("delta").load(settings.table(table)).schema
            for table in ("silver", "slice_ids")
        },
    }
    files = max(1, count * n // ROWS_PER_FILE)
    metadata = json.dumps({"step": "synthesised", "slices": count})
    quarantined = history_rows(spark, first, count, width, 1)
    frames = {
        name: (quarantined if name == "quarantine" else rows).select(
            *[F.col(f"`{c.name}`").cast(c.dataType).alias(c.name) for c in schema.fields]
        )
        for name, schema in schemas.items()
    }
    for name, frame in frames.items():
        writer = frame.coalesce(files).write.format("delta").mode("append")
        if name == "silver":
            writer = writer.partitionBy("event_date")
        writer.option("userMetadata", metadata).save(settings.table(name))
        spend_ids(spark, settings.table(name), name, first, count, width)
    silver = table_version(spark, settings.table("silver"))
    grow_ledger(ledger, settings.topic, first, count, width, offsets, silver)
    ledger.raise_verified_floor(silver)  # as the slices' publications would have


def grow_ledger(
    ledger: Ledger,
    topic: str,
    first: datetime,
    count: int,
    width: timedelta,
    offsets: dict,
    silver: int,
) -> None:
    """Each slice's boundary, slice and step records, through the ledger's own writers
    (its gate and publication at silver's version `silver`)."""
    ledger.newest_boundary()  # lays out the day folders once, before the threads

    def one(j: int) -> None:
        at = first + j * width
        lower, upper = Boundary(topic, at, offsets, at), Boundary(topic, at + width, offsets, at)
        ledger.put_boundary(upper)
        sl = slice_between(lower, upper)
        ledger.save_slice(sl)
        for step in ("bronze", "silver", "gate", "publish"):
            info = {"synthesised": True, "success": True, "silver_version": silver}
            ledger.record_step(sl.slice_id, step, info)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(count)))


def history_rows(spark, first: datetime, count: int, width: timedelta, n: int) -> Any:
    """Every column bronze, quarantine, silver and `slice_ids` take, for `n` records
    in each of `count` slices of `width` from `first` (`j` the slice, `i` the record)."""
    start_us, width_us = int(first.timestamp() * 1e6), int(width.total_seconds() * 1e6)
    at = f"timestamp_micros({start_us} + j * {width_us})"
    moment = f"timestamp_micros({start_us} + j * {width_us} + i * {width_us // n})"
    stamp_of = "date_format({}, \"yyyyMMdd'T'HHmmss'Z'\")"
    tag = f"'s' || date_format({at}, 'yyyyMMddHHmm')"
    columns = {
        "slice_id": f"{stamp_of.format(at)} || '-' || "
        f"{stamp_of.format(f'timestamp_micros({start_us} + (j + 1) * {width_us})')}",
        "event_id": f"{tag} || '-' || i",
        "occurred_at": moment,
        "event_type": "'click'",
        "payload": "'{}'",
        "event_date": f"to_date({moment})",
        "topic": "'synthesised'",
        "partition": f"CAST(i % {PARTITIONS} AS INT)",
        "offset": "i",
        "timestamp": moment,
        "timestamp_type": "0",
        "key": "CAST(NULL AS BINARY)",
        "value": f"CAST(to_json(named_struct('event_id', {tag} || '-' || i, 'event_type', "
        f"'click', 'occurred_at', date_format({moment}, \"yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'\"), "
        "'payload', map())) AS BINARY)",
        "headers": "CAST(array() AS ARRAY<STRUCT<key: STRING, value: BINARY>>)",
        "reason": "'invalid_json'",
        "copies": "1",
        "kafka_partition": f"CAST(i % {PARTITIONS} AS INT)",
        "kafka_offset": "i",
        "kafka_timestamp": moment,
    }
    base = spark.range(count * n, numPartitions=max(1, count * n // ROWS_PER_FILE))
    base = base.selectExpr(f"id DIV {n} AS j", f"id % {n} AS i")
    return base.selectExpr(*[f"{sql} AS `{name}`" for name, sql in columns.items()])


def spend_ids(spark, path: str, table: str, first: datetime, count: int, width: timedelta) -> None:
    """One commit holding the idempotent-write ids the slices' own writes would have left
    (`slicewise/<table>/<slice>`, last updated at the slice's end), written by hand."""
    version = table_version(spark, path) + 1
    now = int(time.time() * 1000)
    lines = [json.dumps({"commitInfo": {"timestamp": now, "operation": "WRITE",
                                        "userMetadata": "synthesised ids"}})]  # fmt: skip
    for j in range(count):
        at = first + j * width
        slice_id = f"{stamp(at)}-{stamp(at + width)}"
        updated = int((at + width).timestamp() * 1000)
        lines.append(json.dumps({"txn": {"appId": f"slicewise/{table}/{slice_id}",
                                         "version": 0, "lastUpdated": updated}}))  # fmt: skip
    created = open_store(path).create(f"_delta_log/{version:020d}.json", "\n".join(lines).encode())
    assert created, f"{path}: version {version} was written meanwhile"


def table_sizes(spark, settings: Settings) -> dict[str, dict[str, int]]:
    sizes = {}
    for name in (*GROWN, "gold_events_per_hour", "key_index"):
        path = settings.table(name)
        if not table_exists(spark, path):
            continue
        detail = spark.sql(f"DESCRIBE DETAIL {delta_ref(path)}").first()
        sizes[name] = {"files": int(detail["numFiles"]), "bytes": int(detail["sizeInBytes"])}
    sizes["slice_ids"]["keys"] = (
        spark.read.format("delta").load(settings.table("slice_ids")).count()
    )
    return sizes


def run_store(store: str, args: argparse.Namespace, work: Path, broker, server) -> dict:
    lakehouse = str(work / store / "lakehouse")
    if store == "s3":
        lakehouse = f"s3a://{server['s3'].create_bucket(f'longhaul-{uuid.uuid4().hex[:8]}')}/lh"
    topic = f"longhaul-{store}-{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "SLICEWISE_KAFKA_BOOTSTRAP": broker.bootstrap,
        "SLICEWISE_TOPIC": topic,
        "SLICEWISE_STATE_DIR": str(work / store),
        "SLICEWISE_LAKEHOUSE": lakehouse,
        "SLICEWISE_SPARK_REMOTE": server["url"],
        "SLICEWISE_STEP_TIMEOUT": "60s",
    }
    if args.horizon_days is not None:
        env["SLICEWISE_PIPELINES_FILE"] = str(definitions(work, args.horizon_days))
    settings = load_settings(env)
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new = NewTopic(topic, PARTITIONS, 1, config={"retention.ms": "-1"})  # the history is old
    admin.create_topics([new])[topic].result(30)
    producer = TxProducer({"bootstrap.servers": broker.bootstrap}, topic, f"tx-{topic}")
    spark = remote_session(server["url"], f"longhaul-{store}", fresh=True)
    width = timedelta(minutes=1)
    measured, warm = args.measured, 1
    total = max(args.points) + warm + measured
    first = (datetime.now(timezone.utc) - (total + 5) * width).replace(second=0, microsecond=0)
    rows: list[dict] = []
    points: list[dict] = []

    def real(index: int, point: int) -> None:
        at = first + index * width
        row = real_slice(spark, settings, producer, at, width, args.records)
        rows.append({"slice": index + 1, "point": point, **row})
        print(f"[{datetime.now():%H:%M:%S}] {store} slice {index + 1}: {rows[-1]}", flush=True)

    for i in range(2 * measured):
        real(i, 0 if i < measured else 2 * measured)
    done = 2 * measured
    for point in sorted(args.points):
        began = time.perf_counter()
        grow(spark, settings, first + done * width, point - done, width, args.records)
        grown = time.perf_counter() - began
        clock = first + point * width  # the history's, as the daily run's
        upkeep, _ = timed(lambda: run_maintenance(spark, settings, now=clock))  # noqa: B023
        points.append({"slice": point, "grow": grown, "maintenance": upkeep,
                       **table_sizes(spark, settings)})  # fmt: skip
        print(f"[{datetime.now():%H:%M:%S}] {store} history {point}: {points[-1]}", flush=True)
        for i in range(point, point + warm):
            real(i, 0)  # the first slice after the bulk history and maintenance: not counted
        for i in range(point + warm, point + warm + measured):
            real(i, point)
        done = point + warm + measured
    spark.stop()
    baseline = {step: median_at(rows, 2 * measured, step) for step in STEPS}
    ratios = {
        p["slice"]: {step: median_at(rows, p["slice"], step) / baseline[step] for step in STEPS}
        for p in points
    }
    keys = {2 * measured: 2 * measured * args.records, **{
        p["slice"]: p["slice_ids"]["keys"] for p in points}}  # fmt: skip
    return {"store": store, "name": name_of(store, args), "records": args.records,
            "horizon_days": settings.dedup_horizon_days, "measured": rows, "history": points,
            "ratios": ratios, "fits": fits(rows, keys), "target": TARGET}  # fmt: skip


def name_of(store: str, args: argparse.Namespace) -> str:
    horizon = "" if args.horizon_days is None else f"-horizon{args.horizon_days}"
    return f"{store}{horizon}"


def definitions(work: Path, horizon_days: int) -> Path:
    """The default pipeline with another dedup horizon."""
    import yaml

    doc = yaml.safe_load((REPO_ROOT / "pipelines.yaml").read_text())
    doc["pipelines"]["events"]["horizon_days"] = horizon_days
    path = work / f"pipelines-horizon{horizon_days}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def median_at(rows: list[dict], point: int, step: str) -> float:
    return statistics.median(r[step] for r in rows if r["point"] == point)


def fits(rows: list[dict], keys: dict[int, int]) -> dict[str, dict[str, float]]:
    """Per step, the least-squares line of its medians against the millions of keys in
    `slice_ids` at each point, and where it reaches at a year of one-minute slices."""
    per_slice = max(keys.values()) / max(keys)
    out = {}
    for step in STEPS:
        xs = [keys[p] / 1e6 for p in sorted(keys)]
        ys = [median_at(rows, p, step) for p in sorted(keys)]
        slope, intercept = statistics.linear_regression(xs, ys)
        out[step] = {"seconds_per_million_keys": slope, "at_zero": intercept,
                     "at_a_year": intercept + slope * YEAR * per_slice / 1e6}  # fmt: skip
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 3, figsize=(16, 4.5 * len(results)), squeeze=False)
    for row, result in zip(axes, results, strict=True):
        store, counted = (
            result.get("name", result["store"]),
            [r for r in result["measured"] if r["point"]],
        )
        for step in STEPS:
            xs = [r["slice"] for r in counted]
            row[0].plot(xs, [r[step] for r in counted], "o", label=step)
            row[2].plot(xs, [r[f"{step}_ledger_calls"] for r in counted], "o", label=step)
        row[0].set(title=f"{store}: seconds per step", xlabel="slice", ylabel="s", xscale="log")
        row[2].set(title=f"{store}: ledger calls per step", xlabel="slice", xscale="log")
        for name in GROWN:
            xs = [t["slice"] for t in result["history"]]
            row[1].plot(xs, [t[name]["bytes"] / 1e6 for t in result["history"]], "o-", label=name)
        row[1].set(title=f"{store}: MB per table", xlabel="slice", xscale="log", yscale="log")
        for ax in row:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--points", type=int, nargs="+", default=[1440, 10080, 43200],
        help="slices of history at which slices are measured (a day, a week, a month)",
    )  # fmt: skip
    parser.add_argument("--measured", type=int, default=5, help="slices measured a point")
    parser.add_argument("--records", type=int, default=1200, help="records per slice")
    parser.add_argument("--stores", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument(
        "--horizon-days", type=int, help="the pipeline's dedup horizon, if not its definition's"
    )
    args = parser.parse_args()
    if min(args.points) <= 2 * args.measured:
        parser.error(f"--points must be past the first {2 * args.measured} slices")
    work = Path(tempfile.mkdtemp(prefix="slicewise-longhaul-"))
    settings = load_settings()
    results = []
    with LocalS3(work / "s3", settings.cache_dir) as s3:
        os.environ.update(s3.env)
        (port,) = free_ports(1)
        with (
            running_broker(work / "broker") as broker,
            SparkConnectServer(work / "spark-connect", port, "local[*]") as server,
        ):
            warm_up(server.url, server.home)
            for store in args.stores:
                results.append(run_store(store, args, work, broker, {"url": server.url, "s3": s3}))
    RESULTS.mkdir(parents=True, exist_ok=True)
    for result in results:
        (RESULTS / f"longhaul-{result['name']}.json").write_text(json.dumps(result, indent=1))
    # Every store's latest run, so that a run of one store keeps the other's in the plot.
    stored = [
        json.loads(f.read_text()) for f in sorted(RESULTS.glob("longhaul-*.json"))
        if "history" in json.loads(f.read_text())
    ]  # fmt: skip
    plot(stored, RESULTS / "longhaul.png")
    for result in results:
        print(f"\n{result['name']}: each step's median over its median at slice "
              f"{2 * args.measured} (target <= {TARGET})")  # fmt: skip
        for point, ratios in result["ratios"].items():
            shown = "  ".join(f"{step} {ratio:4.2f}x" for step, ratio in ratios.items())
            print(f"  {point:>7} slices: {shown}")
        print("  fitted to the keys in slice_ids, at a year of one-minute slices:")
        for step, fit in result["fits"].items():
            print(f"  {step:8} {fit['seconds_per_million_keys'] * 1000:7.2f} ms per million "
                  f"keys, {fit['at_a_year']:6.2f} s at a year")  # fmt: skip


if __name__ == "__main__":
    main()
