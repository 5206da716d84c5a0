"""The long-haul benchmark: does a slice cost the same after a long history as at first?

    make bench-longhaul                                  # 2,000 slices, local, then on s3proxy
    .venv/bin/python bench/longhaul.py --slices 200 --stores local

Per store (a local folder; s3proxy, the tests' S3-compatible server, for tables and
ledger), one pipeline of hourly slices on a real broker and a warm Spark Connect server:

1. `2 x --measured` (20) early slices go through the real steps (plan, ingest, gate,
   publish, and `status --last 10`), each timed, its ledger calls counted; the second
   `--measured` of them are the early window (so that `status --last 10` shows as
   many slices there as late).
2. The history up to `--slices` is synthesised, for speed, through the same writers:
   each slice's boundaries and records in the ledger (`Ledger`), its rows appended to
   bronze, quarantine, `slice_ids` and silver (gold is only rebuilt by the real
   slices' publish), `--batch` (4) slices per commit with a file per slice (per event
   date in silver), as the steps' commits leave them. Maintenance (`run_maintenance`,
   the real one, on the history's clock) runs every 24 slices, as the daily DAG would
   with hourly slices, with a one-minute VACUUM retention so that it frees files
   during the run. Files and bytes per table are sampled there.
3. `--measured` late slices go through the real steps again.

Writes bench/results/longhaul-<store>.json and a plot, longhaul.png, of each step's time,
the files and bytes per table and the ledger calls against the slice number; prints the
ratio of each step's median over the late slices to the early ones (target <= 1.2).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

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
from slicewise.slices import Boundary, slice_between
from slicewise.spark import remote_session
from slicewise.tables import append_once, delta_ref, side_by_side
from slicewise_dev.broker import free_ports, running_broker
from slicewise_dev.counting_store import CountingStore
from slicewise_dev.producer import Record, TxProducer, event_value
from slicewise_dev.s3 import LocalS3

RESULTS = REPO_ROOT / "bench" / "results"
HOUR = timedelta(hours=1)
PARTITIONS = 3
TARGET = 1.2
STEPS = ("plan", "ingest", "gate", "publish", "status")


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


def records(hour: datetime, n: int, tag: str) -> list[Record]:
    step = HOUR / n
    return [
        Record(event_value(f"{tag}-{i}", hour + i * step), i % PARTITIONS, hour + i * step)
        for i in range(n)
    ]


def timed(action: Callable[[], Any]) -> tuple[float, int]:
    """Seconds and ledger calls of one action."""
    calls, began = ledger_calls(), time.perf_counter()
    action()
    return time.perf_counter() - began, ledger_calls() - calls


def real_slice(spark, settings: Settings, producer: TxProducer, at: datetime, n: int) -> dict:
    """One slice through the real steps, each timed and its ledger calls counted."""
    producer.send(records(at, n, at.strftime("%Y%m%d%H")))
    row: dict[str, Any] = {}
    planned: list = []
    later = datetime.now(timezone.utc) + timedelta(days=1)
    steps: dict[str, Callable[[], Any]] = {
        "plan": lambda: planned.append(plan_slice(settings, at, at + HOUR, now=later)),
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


def synthesise(spark, settings: Settings, hours: list[datetime], n: int) -> None:
    """A few consecutive slices' history through the writers the steps use: each slice's
    boundary, slice and step records in the ledger, and per table one commit that holds
    one file per slice (per event date in silver), as the slices' own commits would.
    Batching the commits is what makes 2,000 slices fit in an hour; NOTES.md says what
    it changes (fewer log entries and idempotent-write ids than the real steps leave)."""
    ledger = Ledger.of(settings)
    schemas = {
        name: spark.read.format("delta").load(settings.table(name)).schema
        for name in ("silver", "slice_ids")
    }
    bronze, quarantine, silver, slice_ids, made = [], [], [], [], []
    for at in hours:
        start = ledger.boundary(at)
        end = ledger.put_boundary(Boundary(settings.topic, at + HOUR, dict(start.offsets), at))
        sl = slice_between(start, end)
        ledger.save_slice(sl)
        made.append(sl.slice_id)
        tag = f"s{at:%Y%m%d%H}"
        rows = [
            (settings.topic, i % PARTITIONS, i, at + i * (HOUR / n), 0, None,
             event_value(f"{tag}-{i}", at + i * (HOUR / n)), [], sl.slice_id)
            for i in range(n)
        ]  # fmt: skip
        bronze.append(spark.createDataFrame(rows, BRONZE).coalesce(1))
        quarantine.append(
            spark.createDataFrame([(*rows[0][:8], "invalid_json", sl.slice_id)], QUARANTINE)
        )
        for name, frames in (("silver", silver), ("slice_ids", slice_ids)):
            columns = ", ".join(
                _column(f.name, f.dataType, tag, at, sl.slice_id) for f in schemas[name]
            )
            frames.append(spark.sql(f"SELECT {columns} FROM range({n})").coalesce(1))
    batch = f"{hours[0]:%Y%m%d%H}+{len(hours)}"
    side_by_side(  # as silver's writes run
        lambda: append_once(
            union(bronze), settings.table("bronze"), f"bronze/{batch}", {"step": "bronze"}
        ),
        lambda: append_once(
            union(quarantine), settings.table("quarantine"), f"quarantine/{batch}",
            {"step": "quarantine"},
        ),
        # silver: a MERGE's commit, here an append of new keys
        lambda: union(silver).write.format("delta").mode("append").save(settings.table("silver")),
        lambda: append_once(
            union(slice_ids), settings.table("slice_ids"), f"slice_ids/{batch}",
            {"step": "slice_ids"},
        ),
    )  # fmt: skip
    for slice_id in made:
        for step in ("bronze", "silver", "gate", "publish"):
            ledger.record_step(slice_id, step, {"synthesised": True, "success": True})


def union(frames: list) -> Any:
    """One partition per slice's frame, so one file per slice (per partition value)."""
    return functools.reduce(lambda a, b: a.unionAll(b), frames)


def _column(column: str, kind: Any, tag: str, at: datetime, slice_id: str) -> str:
    """A synthesised silver (or slice_ids) column over range(n)'s `id`, of its type."""
    moment = f"(timestamp'{at:%Y-%m-%d %H:%M:%S}' + make_interval(0,0,0,0,0,0,id))"
    known = {
        "event_id": f"'{tag}-' || id",
        "event_type": "'click'",
        "occurred_at": moment,
        "payload": "'{}'",
        "event_date": f"to_date({moment})",
        "kafka_partition": f"CAST(id % {PARTITIONS} AS INT)",
        "kafka_offset": "id",
        "kafka_timestamp": moment,
        "slice_id": f"'{slice_id}'",
        "copies": "CAST(1 AS INT)",
        "reason": "CAST(NULL AS STRING)",
    }
    return f"CAST({known.get(column, 'NULL')} AS {kind.simpleString()}) AS `{column}`"


def table_sizes(spark, settings: Settings) -> dict[str, dict[str, int]]:
    sizes = {}
    for name in ("bronze", "silver", "quarantine", "slice_ids", "gold_events_per_hour"):
        detail = spark.sql(f"DESCRIBE DETAIL {delta_ref(settings.table(name))}").first()
        sizes[name] = {"files": int(detail["numFiles"]), "bytes": int(detail["sizeInBytes"])}
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
        "SLICEWISE_PIPELINES_FILE": str(definitions(work)),
        "SLICEWISE_STEP_TIMEOUT": "60s",
    }
    settings = load_settings(env)
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new = NewTopic(topic, PARTITIONS, 1, config={"retention.ms": "-1"})  # the history is old
    admin.create_topics([new])[topic].result(30)
    producer = TxProducer({"bootstrap.servers": broker.bootstrap}, topic, f"tx-{topic}")
    spark = remote_session(server["url"], f"longhaul-{store}", fresh=True)
    first = (datetime.now(timezone.utc) - (args.slices + 2) * HOUR).replace(
        minute=0, second=0, microsecond=0
    )
    rows: list[dict] = []
    samples: list[dict] = []
    pending: list[datetime] = []  # synthesised slices not yet written
    for i in range(args.slices):
        at = first + i * HOUR
        real = i < 2 * args.measured or i >= args.slices - args.measured
        if not real:
            pending.append(at)
        if pending and (real or len(pending) == args.batch or (i + 1) % 24 == 0):
            synthesise(spark, settings, pending, args.records)
            pending = []
        if real:
            rows.append({"slice": i + 1, **real_slice(spark, settings, producer, at, args.records)})
            print(f"[{datetime.now():%H:%M:%S}] {store} slice {i + 1}: {rows[-1]}", flush=True)
        if (i + 1) % 24 == 0:
            upkeep, _ = timed(lambda at=at: run_maintenance(spark, settings, now=at + HOUR))
            samples.append({"slice": i + 1, "maintenance": upkeep, **table_sizes(spark, settings)})
            print(f"[{datetime.now():%H:%M:%S}] {store} slice {i + 1}: {samples[-1]}", flush=True)
    spark.stop()
    early = [r for r in rows if args.measured < r["slice"] <= 2 * args.measured]
    late = [r for r in rows if r["slice"] > args.slices - args.measured]
    ratios = {
        step: statistics.median(r[step] for r in late) / statistics.median(r[step] for r in early)
        for step in STEPS
    }
    return {"store": store, "slices": args.slices, "measured": rows, "tables": samples,
            "ratios": ratios, "target": TARGET}  # fmt: skip


def definitions(work: Path) -> Path:
    """The default pipeline, maintenance freeing files within the run (1 min retention)."""
    import yaml

    doc = yaml.safe_load((REPO_ROOT / "pipelines.yaml").read_text())
    doc["pipelines"]["events"]["maintenance"] = {"vacuum_retain": "60s"}
    path = work / "pipelines.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 4, figsize=(20, 4.5 * len(results)), squeeze=False)
    for row, result in zip(axes, results, strict=True):
        store = result["store"]
        for step in STEPS:
            xs = [r["slice"] for r in result["measured"]]
            row[0].plot(xs, [r[step] for r in result["measured"]], "o", label=step)
            row[3].plot(
                xs, [r[f"{step}_ledger_calls"] for r in result["measured"]], "o", label=step
            )
        row[0].set(title=f"{store}: seconds per step", xlabel="slice", ylabel="s")
        row[3].set(title=f"{store}: ledger calls per step", xlabel="slice")
        for name in ("bronze", "silver", "quarantine", "slice_ids", "gold_events_per_hour"):
            xs = [t["slice"] for t in result["tables"]]
            row[1].plot(xs, [t[name]["files"] for t in result["tables"]], label=name)
            row[2].plot(xs, [t[name]["bytes"] / 1e6 for t in result["tables"]], label=name)
        row[1].set(title=f"{store}: files per table after maintenance", xlabel="slice")
        row[2].set(title=f"{store}: MB per table after maintenance", xlabel="slice")
        for ax in row:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slices", type=int, default=2000)
    parser.add_argument("--measured", type=int, default=10)
    parser.add_argument("--records", type=int, default=200, help="records per slice")
    parser.add_argument(
        "--batch", type=int, default=4, help="synthesised slices per commit (1: as the steps)"
    )
    parser.add_argument("--stores", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    args = parser.parse_args()
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
        (RESULTS / f"longhaul-{result['store']}.json").write_text(json.dumps(result, indent=1))
    # Every store's latest run, so that a run of one store keeps the other's in the plot.
    stored = [json.loads((RESULTS / f"longhaul-{s}.json").read_text()) for s in ("local", "s3")]
    plot(stored, RESULTS / "longhaul.png")
    for result in results:
        print(f"\n{result['store']}, slice {result['slices']} against slices "
              f"{args.measured + 1}-{2 * args.measured}:")  # fmt: skip
        for step, ratio in result["ratios"].items():
            print(
                f"  {step:8} {ratio:5.2f}x  {'met' if ratio <= TARGET else 'NOT met'} (<= {TARGET})"
            )


if __name__ == "__main__":
    main()
