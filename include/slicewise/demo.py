"""`make demo`: the main job end to end on the embedded default.

Starts the local Kafka broker, produces a realistic stream over three closed
hourly intervals (committed, aborted and late-committed transactions,
duplicates across partitions and hours, malformed records), runs the Airflow
DAG for each interval (`airflow dags test`: SQLite, the Spark steps as clients of
a Spark Connect server on local[*], started here like the broker),
and prints a reconciled report checked against what was really committed.

Each run starts from a clean demo state (.state/), so it can be repeated.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from slicewise.airflow_env import VENV_BIN, airflow_env, migrate
from slicewise.config import Settings, load_settings
from slicewise.connect_server import SparkConnectServer, embedded, warm_up
from slicewise.kafka.broker import LocalBroker
from slicewise.kafka.producer import Record, TxProducer, ensure_topic, event_value
from slicewise.ledger import Ledger
from slicewise.source import MALFORMED

INTERVALS = 3
EVENTS_PER_INTERVAL = 300
PARTITIONS = 3


def say(step: str, message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {step:<8} {message}", flush=True)


@dataclass
class Oracle:
    """What was really committed: the yardstick for the report."""

    committed_valid: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    malformed: int = 0
    duplicates_sent: int = 0


def produce_stream(settings: Settings, start: datetime, rng: random.Random) -> Oracle:
    conf = {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka_props}
    ensure_topic(conf, settings.topic, PARTITIONS)
    main = TxProducer(conf, settings.topic, "demo-main")
    late = TxProducer(conf, settings.topic, "demo-late")
    oracle = Oracle()
    types = ["page_view", "click", "purchase", "signup"]

    def ev(eid: str, ts: datetime) -> Record:
        return Record(
            event_value(eid, ts, rng.choice(types), {"amount": rng.randint(1, 500)}),
            rng.randrange(PARTITIONS),
            ts,
            key=eid.encode(),
        )

    sent: list[str] = []
    # A transaction opened in the first interval and committed only at the very end.
    late_ids = [f"late-{i}" for i in range(20)]
    late.begin([ev(i, start + timedelta(minutes=5)) for i in late_ids])
    for k in range(INTERVALS):
        base = start + timedelta(hours=k)
        for batch in range(EVENTS_PER_INTERVAL // 50):
            records = []
            for i in range(50):
                eid = f"evt-{k}-{batch * 50 + i}"
                records.append(ev(eid, base + timedelta(seconds=rng.randrange(3600))))
                sent.append(eid)
            # ~5% re-sent, possibly to another partition and in a later interval.
            for eid in rng.sample(sent, 3):
                records.append(ev(eid, base + timedelta(seconds=rng.randrange(3600))))
                oracle.duplicates_sent += 1
            main.send(records)
            oracle.committed_valid.update(r.key.decode() for r in records)
        aborted = [f"aborted-{k}-{i}" for i in range(25)]
        main.send([ev(i, base + timedelta(minutes=30)) for i in aborted], commit=False)
        oracle.aborted.update(aborted)
        main.send(
            [
                Record(bad, rng.randrange(PARTITIONS), base + timedelta(minutes=40))
                for bad in MALFORMED
            ]
        )
        oracle.malformed += len(MALFORMED)
    late.commit()
    oracle.committed_valid.update(late_ids)
    return oracle


def run_dag(env: dict[str, str], start: datetime, end: datetime) -> tuple[bool, float, str]:
    log = f"{env['SLICEWISE_STATE_DIR']}/demo-logs/run-{start:%Y%m%dT%H%M}.log"
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(
            [str(VENV_BIN / "airflow"), "dags", "test", "slicewise_pipeline", end.isoformat()],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc.returncode == 0, time.monotonic() - t0, log


def report(settings: Settings, server: SparkConnectServer, oracle: Oracle) -> bool:
    from pyspark.sql import functions as F

    from slicewise.spark import remote_session

    spark = remote_session(server.url, "slicewise-demo-report")
    silver = spark.read.format("delta").load(settings.table("silver"))
    ids = {r.event_id for r in silver.select("event_id").collect()}
    rows, distinct = silver.count(), silver.select("event_id").distinct().count()
    quarantined = spark.read.format("delta").load(settings.table("quarantine")).count()
    gold = spark.read.format("delta").load(settings.table("gold_events_per_hour"))
    gold_total = gold.agg(F.sum("events")).first()[0]

    ledger = Ledger(settings.ledger_dir, settings.topic)
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
        "every malformed record is quarantined": quarantined == oracle.malformed,
        "gold counts every silver row once": gold_total == rows,
    }
    print(
        f"\nsilver: {rows} rows, {distinct} distinct event_ids; committed valid ids sent: "
        f"{len(oracle.committed_valid)} (+{oracle.duplicates_sent} duplicate sends, "
        f"{len(oracle.aborted)} aborted, {oracle.malformed} malformed)"
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


def start_engine(server: SparkConnectServer) -> None:
    t0 = time.monotonic()
    server.start()
    say(
        "spark",
        f"Spark Connect server up at {server.url} in {time.monotonic() - t0:.1f}s "
        "(local[*], Delta, Kafka connector); every Spark step is a client of it",
    )
    warm_up(server.url, server.home)
    say("spark", f"server warmed up ({time.monotonic() - t0:.1f}s after its start)")


def main() -> int:
    settings = load_settings()
    rng = random.Random(7)
    say("reset", f"clean demo state in {settings.state_dir}")
    broker = LocalBroker(settings.state_dir, settings.cache_dir)
    broker.stop()
    # A fresh server too: a warm one would remember the deleted tables' Delta logs.
    server = embedded(settings)
    server.stop()
    for sub in ("kafka", "lakehouse", "airflow", "data_docs", "demo-logs"):
        shutil.rmtree(settings.state_dir / sub, ignore_errors=True)
    (settings.state_dir / "demo-logs").mkdir(parents=True)

    t0 = time.monotonic()
    # The Spark Connect server starts, and is warmed up, while the broker starts, the
    # stream is produced and Airflow's DB is set up: a long-lived server is warm; only
    # one that has just started would make the first run pay for it.
    engine = threading.Thread(target=start_engine, args=(server,), daemon=True)
    engine.start()
    broker.start(timeout=120)
    say(
        "kafka",
        f"broker up at {broker.bootstrap} in {time.monotonic() - t0:.1f}s (KRaft, transactions on)",
    )

    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=INTERVALS)
    oracle = produce_stream(settings, start, rng)
    say(
        "produce",
        f"{len(oracle.committed_valid)} committed events (+{oracle.duplicates_sent} duplicates), "
        f"{len(oracle.aborted)} aborted, {oracle.malformed} malformed, one late-committed transaction",
    )

    env = airflow_env(settings)
    env["SLICEWISE_GRACE_SECONDS"] = "0"
    migrate(env)
    say("airflow", f"metadata DB ready (SQLite in {env['AIRFLOW_HOME']})")
    engine.join()
    if not server.running():
        print(f"the Spark Connect server did not start:\n{server.log_tail()}", file=sys.stderr)
        return 1
    for k in range(INTERVALS):
        lo, hi = start + timedelta(hours=k), start + timedelta(hours=k + 1)
        say(
            "dag",
            f"interval {k + 1}/{INTERVALS} [{lo:%H:%M}, {hi:%H:%M}) UTC: running slicewise_pipeline ...",
        )
        ok, took, log = run_dag(env, lo, hi)
        say(
            "dag",
            f"interval {k + 1}/{INTERVALS} {'succeeded' if ok else 'FAILED'} in {took:.0f}s (log: {log})",
        )
        if not ok:
            print(f"see {log}; `make status` shows the ledger", file=sys.stderr)
            return 1
    say("report", "reading silver, quarantine, gold and the ledger")
    ok = report(settings, server, oracle)
    summary = {"ok": ok, "seconds": round(time.monotonic() - t0)}
    print(
        f"\n{json.dumps(summary)}\nbroker and Spark Connect server left running for "
        "`make airflow-ui`; stop them with `make broker-stop spark-connect-stop`"
    )
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
