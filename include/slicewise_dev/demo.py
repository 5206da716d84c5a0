"""`make demo`: the main job end to end on the embedded default.

Starts the local Kafka broker, produces a realistic stream over three closed
hourly intervals (committed, aborted and late-committed transactions,
duplicates across partitions and hours, malformed records), backfills the three
intervals through Airflow's own scheduler and api-server (LocalExecutor, SQLite;
the Spark steps as clients of a Spark Connect server on local[*], started here
like the broker), and prints a reconciled report checked against what was really
committed. The runs carry the timetable's logical dates, so `make airflow-ui`
afterwards schedules the next interval, and a UI backfill over these hours finds
their runs instead of running a slice twice.

Each run starts from a clean demo state (.state/), so it can be repeated.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

from slicewise.config import Settings, load_settings
from slicewise.connect_server import SparkConnectServer, embedded, warm_up
from slicewise.ledger import Ledger
from slicewise.pipelines import definitions_file
from slicewise_dev import source
from slicewise_dev.airflow_env import airflow_env
from slicewise_dev.airflow_services import AirflowServices, Run
from slicewise_dev.broker import LocalBroker
from slicewise_dev.source import Faults, Manifest

INTERVALS = 3
MAX_ACTIVE_RUNS = 2  # one per core; each run's Spark work is on the one server
EVENTS = 900
PARTITIONS = 3


def say(step: str, message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {step:<8} {message}", flush=True)


def produce_stream(settings: Settings, start: datetime) -> Manifest:
    """Three hours of events with every fault the pipeline must absorb: re-sent ids
    (to any partition, in a later hour too), aborted transactions, malformed records
    and one transaction left open from the first hour until the very end."""
    faults = Faults(duplicate_rate=0.06, aborted_rate=0.2, malformed_rate=0.03, open_transactions=1)
    return source.produce(settings, start, INTERVALS, EVENTS, faults, PARTITIONS, seed=7)


def report(settings: Settings, server: SparkConnectServer, oracle: Manifest) -> bool:
    from pyspark.sql import functions as F

    from slicewise.spark import remote_session

    spark = remote_session(server.url, "slicewise-demo-report")
    silver = spark.read.format("delta").load(settings.table("silver"))
    ids = {r.event_id for r in silver.select("event_id").collect()}
    rows, distinct = silver.count(), silver.select("event_id").distinct().count()
    quarantined = spark.read.format("delta").load(settings.table("quarantine")).count()
    gold = spark.read.format("delta").load(settings.table("gold_events_per_hour"))
    gold_total = gold.agg(F.sum("events")).first()[0]

    ledger = Ledger.of(settings)
    print(
        "\nslice                               read  quarantined  dup-in-slice  dup-in-silver  inserted  gate"
    )
    for sl in ledger.slices():
        gate = ledger.step(sl.slice_id, "gate") or {}
        c = gate.get("counts") or {}
        print(
            f"{sl.slice_id:34} {c.get('read', '-'):>5} {c.get('quarantined', '-'):>12} "
            f"{c.get('duplicates_in_slice', '-'):>13} {c.get('duplicates_in_silver', '-'):>14} "
            f"{c.get('inserted', '-'):>9}  {'pass' if gate.get('success') else 'FAIL'}"
        )
    lost = oracle.committed_valid - ids
    extra = ids - oracle.committed_valid
    checks = {
        "silver holds each event_id once": rows == distinct,
        "every committed valid event is in silver (none lost)": not lost,
        "nothing from aborted transactions or elsewhere": not extra,
        "every malformed record is quarantined": quarantined == len(oracle.malformed),
        "gold counts every silver row once": gold_total == rows,
    }
    print(
        f"\nsilver: {rows} rows, {distinct} distinct event_ids; committed valid ids sent: "
        f"{len(oracle.committed_valid)} (+{oracle.duplicates_sent} duplicate sends, "
        f"{len(oracle.aborted)} aborted, {len(oracle.malformed)} malformed)"
    )
    for name, ok in checks.items():
        print(f"  {'OK  ' if ok else 'FAIL'} {name}")
    print(f"\nData Docs:  file://{settings.data_docs_dir}/index.html")
    print(f"Lakehouse:  {settings.lakehouse}   (status: `make status`)")
    print(
        "Airflow UI: `make airflow-ui`, then http://localhost:8080 (same state; trigger a backfill there)"
    )
    spark.stop()
    return all(checks.values())


def start_engine(server: SparkConnectServer, up: threading.Event) -> None:
    t0 = time.monotonic()
    try:
        server.start()
    finally:
        up.set()
    say(
        "spark",
        f"Spark Connect server up at {server.url} in {time.monotonic() - t0:.1f}s "
        "(local[*], Delta, Kafka connector); every Spark step is a client of it",
    )
    # Warmed up beside the first tasks rather than before them: the runs start as
    # soon as Airflow is up, and their first tasks (the interval's sensor, the plan)
    # need no Spark. Without a warm-up the first Spark steps pay it, slower still.
    warm_up(server.url, server.home)
    say("spark", f"server warmed up ({time.monotonic() - t0:.1f}s after its start)")


def main() -> int:
    settings = load_settings()
    say(
        "pipeline",
        f"{settings.pipeline.name} from {definitions_file()} (topic {settings.topic}, "
        f"key {', '.join(settings.pipeline.key)}, DAG {settings.pipeline.dag_id})",
    )
    say("reset", f"clean demo state in {settings.state_dir}")
    broker = LocalBroker(settings.state_dir, settings.cache_dir)
    broker.stop()
    # A fresh server too: a warm one would remember the deleted tables' Delta logs.
    server = embedded(settings)
    server.stop()
    for sub in ("kafka", "lakehouse", "airflow", "data_docs", "demo-logs", "lineage"):
        shutil.rmtree(settings.state_dir / sub, ignore_errors=True)
    (settings.state_dir / "demo-logs").mkdir(parents=True)

    t0 = time.monotonic()
    # The Spark Connect server starts while the broker starts, the stream is produced
    # and Airflow's DB is set up, then warms up beside the first tasks (`start_engine`):
    # a long-lived server is warm; one that has just started would make the first
    # Spark steps pay for it.
    up = threading.Event()
    threading.Thread(target=start_engine, args=(server, up), daemon=True).start()
    broker.start(timeout=120)
    say(
        "kafka",
        f"broker up at {broker.bootstrap} in {time.monotonic() - t0:.1f}s (KRaft, transactions on)",
    )

    end = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=INTERVALS)
    oracle = produce_stream(settings, start)
    say(
        "produce",
        f"{len(oracle.committed_valid)} committed events (+{oracle.duplicates_sent} duplicates), "
        f"{len(oracle.aborted)} aborted, {len(oracle.malformed)} malformed, one late-committed transaction",
    )

    env = airflow_env(settings)
    env["SLICEWISE_GRACE_SECONDS"] = "0"
    # The runs' OpenLineage events go to a file (docs/DEPLOYING.md#openlineage), unless
    # the environment names a transport of its own.
    lineage = settings.state_dir / "lineage" / "events.jsonl"
    lineage.parent.mkdir(parents=True, exist_ok=True)
    env.setdefault(
        "AIRFLOW__OPENLINEAGE__TRANSPORT",
        json.dumps({"type": "file", "log_file_path": str(lineage), "append": True}),
    )
    logs = settings.state_dir / "demo-logs"
    dag_id = settings.pipeline.dag_id
    with AirflowServices(env, logs, dag_ids=(dag_id,)) as services:
        say("airflow", f"scheduler and api-server up (SQLite in {env['AIRFLOW_HOME']})")
        up.wait()
        if not server.running():
            print(f"the Spark Connect server did not start:\n{server.log_tail()}", file=sys.stderr)
            return 1
        say(
            "dag",
            f"backfilling {dag_id} over [{start:%H:%M}, {end:%H:%M}) UTC: "
            f"{INTERVALS} hourly runs, {MAX_ACTIVE_RUNS} at a time ...",
        )

        def finished(run: Run) -> None:
            at = run.logical_date
            say(
                "dag",
                f"run of [{at:%H:%M}, {at + timedelta(hours=1):%H:%M}) {run.state} in "
                f"{run.seconds or 0:.0f}s",
            )

        runs = services.backfill(
            start,
            end,
            max_active_runs=MAX_ACTIVE_RUNS,
            on_finished=finished,
            until_closed=False,
            dag_id=dag_id,
        )
    if any(r.state != "success" for r in runs.values()):
        print(
            f"a run failed: task logs under {env['AIRFLOW_HOME']}/logs, the scheduler's in "
            f"{logs}; `make status` shows the ledger",
            file=sys.stderr,
        )
        return 1
    say("report", "reading silver, quarantine, gold and the ledger")
    ok = report(settings, server, oracle)
    if lineage.exists():
        say("lineage", f"{len(lineage.read_text().splitlines())} OpenLineage events in {lineage}")
    summary = {"ok": ok, "seconds": round(time.monotonic() - t0)}
    print(
        f"\n{json.dumps(summary)}\nbroker and Spark Connect server left running for "
        "`make airflow-ui`; `make stop` stops them"
    )
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
