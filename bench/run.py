"""The benchmark: our pipeline side by side with the standard Spark baseline, in one run.

    make bench                                   # .venv/bin/python bench/run.py
    .venv/bin/python bench/run.py --records 200000 --w3-slice 20000 --scales 1 10

One broker; per slice size (--records, 0.5 M and 2 M by default) a topic with one
slice of committed offsets (with duplicates, malformed records and aborted
transactions); W0, W1 and W2 read exactly that slice, each in a fresh process
(bench/workloads.py). The first size also runs through Airflow and sets W3's
MERGE slice; the largest measures read_committed against read_uncommitted
(--isolation-repeats times). With `w2avro`, W2 also runs on the same number of
records in Avro (docs/examples/avro-events.yaml, the schemas in a local Apicurio
registry) beside W2 on JSON. Then one-minute slices on a warm engine (W2, then W1+
on the same schedule) and the Spark steps run by hand, each in a driver of its own.
Prints a markdown table and writes it, the raw numbers and a plot to bench/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil

from slicewise.config import Settings, load_settings
from slicewise.connect_server import SparkConnectServer, connect_connection, warm_up
from slicewise.home import REPO_ROOT
from slicewise.planner import plan_slice
from slicewise.spark import classic_env
from slicewise_dev import source
from slicewise_dev.airflow_env import VENV_BIN, airflow_env
from slicewise_dev.airflow_services import AirflowServices
from slicewise_dev.broker import free_ports, running_broker
from slicewise_dev.producer import Record, TxProducer
from slicewise_dev.registry import LocalRegistry
from slicewise_dev.source import Faults

RESULTS = REPO_ROOT / "bench" / "results"
WORKLOADS = Path(__file__).with_name("workloads.py")
PARTITIONS = 3
PARTS = ("w0", "w1", "w1plus", "w2", "w2avro", "airflow", "w3", "isolation", "minute", "cli")
QUICK = ("w1plus", "w2", "minute")  # make bench-quick's parts
SIZED = {"w0", "w1", "w1plus", "w2", "w2avro", "airflow", "w3", "isolation"}  # on the slices
TARGETS = {  # from the issues (68: against the same guarantees by hand, W1+; 52 before it)
    "W2/W1+": (">=", 0.85),
    "W2/W1": (">=", 0.7),
    "W2/W1+ peak memory": ("<=", 1.0),
    "W2 peak memory, GiB": ("<=", 4.0),
    "W2/W1+ via Airflow": (">=", 1.2),
    "one-minute slice, plan to publish, seconds": ("<=", 5.0),
    "a step by hand in its own driver, slowest step's median, seconds": ("<=", 20.0),
    "W2/W0": (">=", 0.3),
    "MERGE 100x / 1x": ("<=", 1.2),
    "gate share of slice time": ("<=", 0.10),
}


class PeakRss:
    """Peak resident memory of a process and all its descendants (JVMs included).

    A JVM's child that still runs `java` is a spawn in progress: Hadoop's local file
    system runs `chmod` and `readlink` per file it writes, and between the spawn and
    its exec the child shows the JVM's whole resident set, which is the JVM's own
    memory (vfork), not more. Summed, it counted the JVM twice whenever a sample fell
    in that moment: a workload that writes more files was caught more often (W2's
    peak at 2 M read 4.7 GiB in one run and 7.9 GiB in the next). So such a child
    counts nothing."""

    def __init__(self, pid: int) -> None:
        self.peak = 0
        self._root = psutil.Process(pid)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.wait(0.25):
            try:
                procs = [self._root, *self._root.children(recursive=True)]
                total = 0
                for p in procs:
                    try:
                        if not spawning_jvm(p):
                            total += p.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:
                return

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def spawning_jvm(p: psutil.Process) -> bool:
    """A JVM's child not yet turned into the command it spawns (it shares the JVM's memory)."""
    parent = p.parent()
    return parent is not None and parent.name() == "java" and p.exe() == parent.exe()


def run_tree(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, int, str]:
    """Run a command, return (wall seconds, peak RSS bytes of its tree, stdout)."""
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        rss = PeakRss(proc.pid)
        out, _ = proc.communicate()
    wall, peak = time.perf_counter() - t0, rss.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({proc.returncode}); see {log}")
    return wall, peak, out


def workload(name: str, params: dict, work: Path) -> dict:
    print(f"[{datetime.now():%H:%M:%S}] {name} ({work.name}) ...", flush=True)
    work.mkdir(parents=True, exist_ok=True)
    wall, peak, out = run_tree(
        [sys.executable, str(WORKLOADS), name, json.dumps(params)],
        # Each workload runs its own driver, even after this process opened a Connect session.
        {**classic_env(dict(os.environ)), "PYSPARK_PYTHON": sys.executable},
        work / f"{name}.log",
    )
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    result = {**json.loads(line[len("RESULT ") :]), "wall": wall, "peak_rss": peak}
    print(
        f"[{datetime.now():%H:%M:%S}] {name}: {result.get('seconds', 0):.1f}s of work, "
        f"{wall:.0f}s wall, peak {peak / 2**20:.0f} MiB",
        flush=True,
    )
    return result


# Rounds per process: W1 and W2 run twice in one driver, the second time on fresh tables,
# so the report has the warm steady state of a long-lived driver beside the cold figure.
ROUNDS = {"w0": 1, "w1": 2, "w1plus": 2, "w2": 2, "w2avro": 2}
AVRO_DEFINITION = REPO_ROOT / "docs" / "examples" / "avro-events.yaml"


def median_run(runs: list[dict]) -> dict:
    """The run of median seconds, with every run's seconds, peak and warm seconds."""
    middle = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    warm = [s for r in runs for s in r.get("warm_seconds", [])]
    return {
        **middle,
        "runs": [r["seconds"] for r in runs],
        "peaks": [r["peak_rss"] for r in runs],
        "peak_rss": statistics.median(r["peak_rss"] for r in runs),
        "warm_seconds": warm,
    }


def produce(settings: Settings, start: datetime, n: int) -> dict:
    """n new events in the hour: ~1 % re-sent ids, ~2 % of the transactions aborted, and
    0.1 % truncated JSON (the same stream for every workload, by its seed).

    The poison is one kind the baselines' `from_json` turns into nulls; the source's
    other kinds (an `occurred_at` that is a number) would stop W1's cast, and the
    baselines keep their code."""
    faults = Faults(duplicate_rate=0.01, aborted_rate=0.02, malformed_rate=0, open_transactions=0)
    m = source.produce(settings, start, 1, n, faults, PARTITIONS, seed=1, batch=10_000)
    conf = {"bootstrap.servers": settings.bootstrap_servers}
    poison = [
        Record(b'{"event_id": 42', i % PARTITIONS, start + timedelta(seconds=i % 3600))
        for i in range(n // 1000)
    ]
    TxProducer(conf, settings.topic, "bench-poison").send(
        poison, on_delivered=lambda _r, p, o: m.malformed.add((p, o))
    )
    committed = len(m.committed_valid) + m.duplicates_sent + len(m.malformed)
    return {
        "committed": committed,
        "malformed": len(m.malformed),
        "aborted": m.records_sent - committed,
    }


def airflow_run(settings: Settings, start: datetime, work: Path) -> dict:
    """W2 as it is scheduled: one run of the DAG, backfilled through our own scheduler
    and api-server (LocalExecutor, SQLite; `slicewise_dev.airflow_services`), its Spark
    steps clients of a Spark Connect server on local[*]. The server and Airflow are
    started and warmed up before, as long-lived services are. `seconds` is the run's own
    span in the metadata DB (its start to its end); `wall` runs from the `airflow backfill
    create` command to the run's end; the peak memory is the scheduler's process tree,
    which every task is forked from (the server's is not in it)."""
    (port,) = free_ports(1)
    with SparkConnectServer(work / "spark-connect", port, "local[*]") as server:
        warm_up(server.url, server.home)
        env = {
            **airflow_env(settings),
            "SLICEWISE_GRACE_SECONDS": "0",
            "SLICEWISE_SPARK_REMOTE": server.url,
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_connection(server.url, server.token),
        }
        dag_id = settings.pipeline.dag_id
        with AirflowServices(env, work / "airflow-logs", dag_ids=(dag_id,)) as services:
            print(f"[{datetime.now():%H:%M:%S}] w2 through Airflow ...", flush=True)
            rss = PeakRss(services.pid("scheduler"))
            t0 = time.perf_counter()
            runs = services.backfill(
                start, start + timedelta(hours=1), until_closed=False, dag_id=dag_id
            )
            wall, peak = time.perf_counter() - t0, rss.stop()
    (run,) = runs.values()
    from slicewise.ledger import Ledger

    ledger = Ledger.of(settings)
    (sl,) = ledger.slices()
    if run.state != "success" or not ledger.step(sl.slice_id, "publish"):
        raise SystemExit(f"the DAG run did not publish ({run.state}); see {work / 'airflow-logs'}")
    rows = ledger.step(sl.slice_id, "bronze")["rows"]
    print(
        f"[{datetime.now():%H:%M:%S}] w2 through Airflow: run {run.seconds:.0f}s, {wall:.0f}s "
        "from `backfill create`",
        flush=True,
    )
    return {"seconds": run.seconds, "wall": wall, "peak_rss": peak, "rows": rows}


def airflow_w1_run(settings: Settings, start: datetime, work: Path, workload: str = "w1") -> dict:
    """W1 (or W1+: `workload` "w1plus") as teams schedule it, on the same Airflow set-up as
    W2's scheduled run: one backfilled run of `bench/dags/bench_w1.py`'s DAG for it, whose
    one task spark-submits the same AvailableNow job (a new application, so a JVM start,
    per run). Same figures as `airflow_run`."""
    root, dag_id = work / f"{workload}-airflow", f"bench_{workload}"
    # Classic: this process opened a Connect session for W2's run, which marks its children.
    env = {
        **classic_env(airflow_env(settings)),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "bench" / "dags"),
        "AIRFLOW_VAR_BENCH_W1_ROOT": str(root),
        "PYSPARK_PYTHON": sys.executable,
    }
    with AirflowServices(env, work / f"airflow-{workload}-logs", dag_ids=(dag_id,)) as services:
        print(f"[{datetime.now():%H:%M:%S}] {workload} through Airflow ...", flush=True)
        rss = PeakRss(services.pid("scheduler"))
        t0 = time.perf_counter()
        runs = services.backfill(
            start, start + timedelta(hours=1), until_closed=False, dag_id=dag_id
        )
        wall, peak = time.perf_counter() - t0, rss.stop()
    (run,) = runs.values()
    merged = list(root.glob("*/silver/_delta_log/00000000000000000001.json"))  # its MERGE
    if run.state != "success" or not merged:
        raise SystemExit(
            f"{workload}'s DAG run failed ({run.state}); see {work / f'airflow-{workload}-logs'}"
        )
    print(
        f"[{datetime.now():%H:%M:%S}] {workload} through Airflow: run {run.seconds:.0f}s, "
        f"{wall:.0f}s from `backfill create`",
        flush=True,
    )
    return {"seconds": run.seconds, "wall": wall, "peak_rss": peak}


MINUTE_RECORDS = 1_200  # a one-minute schedule at 20 events a second
MINUTE_WARMUP = 3


def produce_minutes(settings: Settings, first: datetime, count: int) -> Faults:
    """`count` one-minute slices of ~MINUTE_RECORDS records from `first` on the topic of
    `settings`, with the faults the one-minute workloads use (returned)."""
    faults = Faults(duplicate_rate=0.01, aborted_rate=0.02, malformed_rate=0.001)
    source.produce(
        settings, first, count, count * MINUTE_RECORDS, faults, PARTITIONS, seed=2,
        batch=1_000, interval=timedelta(minutes=1),
    )  # fmt: skip
    return faults


def bench_env(bootstrap: str, state: Path, topic: str, cache: Path) -> dict[str, str]:
    """A workload's settings: the bench's broker and jar cache, its own state and topic."""
    return {
        "SLICEWISE_KAFKA_BOOTSTRAP": bootstrap,
        "SLICEWISE_STATE_DIR": str(state),
        "SLICEWISE_TOPIC": topic,
        "SLICEWISE_CACHE_DIR": str(cache),
        "SLICEWISE_GRACE_SECONDS": "0",
    }


def minute_slices(bootstrap: str, cache: Path, work: Path, slices: int) -> dict:
    """W2 on one-minute slices of ~1,200 records each, one after another in one warm
    process (bench/workloads.py `minute`): per-step medians of the last `slices`."""
    env = bench_env(bootstrap, work / "minute", "bench-minute", cache)
    count = MINUTE_WARMUP + slices
    first = (datetime.now(timezone.utc) - timedelta(minutes=count + 5)).replace(
        second=0, microsecond=0
    )
    faults = produce_minutes(load_settings(env), first, count)
    params = {"env": env, "start": first.isoformat(), "warmup": MINUTE_WARMUP, "slices": slices}
    result = {"records": MINUTE_RECORDS, **workload("minute", params, work / "minute")}
    # The same guarantees by hand on the same schedule, right after, in a process of its own.
    by_hand = {
        **params,
        "env": bench_env(bootstrap, work / "minute-w1plus", "bench-minute-w1plus", cache),
        "records": MINUTE_RECORDS,
        "faults": dataclasses.asdict(faults),
        "partitions": PARTITIONS,
    }
    result["w1plus"] = workload("minute_w1plus", by_hand, work / "minute-w1plus")
    return result


CLI_RECORDS = 100
CLI_STEPS = ("ingest", "gate", "publish")


def cli_steps(bootstrap: str, cache: Path, work: Path, slices: int) -> dict:
    """Each Spark step run by hand (`slicewise <step> --slice-id ...`) on slices of 100
    records with no Connect server anywhere: each step a driver of its own, as on-call
    runs it on a host without one, after `slicewise class-archive` (timed too). `slices` hours in turn; each step's seconds from the
    command to its exit, medians."""
    env = bench_env(bootstrap, work / "cli", "bench-cli", cache)
    settings = load_settings(env)
    first = (datetime.now(timezone.utc) - timedelta(hours=slices + 2)).replace(
        minute=0, second=0, microsecond=0
    )
    faults = Faults(duplicate_rate=0, aborted_rate=0, malformed_rate=0, open_transactions=0)
    source.produce(settings, first, slices, slices * CLI_RECORDS, faults, PARTITIONS, seed=3)
    child = {
        **classic_env({k: v for k, v in os.environ.items() if k != "SLICEWISE_SPARK_REMOTE"}),
        **env,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    # As the docs ask of a host where steps run by hand: the drivers' class archive once.
    began = time.monotonic()
    archive = subprocess.run(
        [str(VENV_BIN / "slicewise"), "class-archive"],
        env=child, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if archive.returncode != 0:
        raise SystemExit(f"slicewise class-archive:\n{archive.stderr[-3000:]}")
    archive_seconds = time.monotonic() - began
    runs = []
    for k in range(slices):
        at = first + timedelta(hours=k)
        slice_id = plan_slice(settings, at, at + timedelta(hours=1)).slice_id
        seconds = {}
        for step in CLI_STEPS:
            began = time.monotonic()
            out = subprocess.run(
                [str(VENV_BIN / "slicewise"), step, "--slice-id", slice_id],
                env=child, capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            seconds[step] = time.monotonic() - began
            if out.returncode != 0 or "in its own driver" not in out.stderr:
                raise SystemExit(f"slicewise {step} of {slice_id}:\n{out.stderr[-3000:]}")
        print(f"[{datetime.now():%H:%M:%S}] by hand {slice_id}: {seconds}", flush=True)
        runs.append(seconds)
    return {
        "records": CLI_RECORDS,
        "class_archive_seconds": archive_seconds,
        "steps": {s: statistics.median(r[s] for r in runs) for s in CLI_STEPS},
        "runs": runs,
    }


def machine() -> str:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
        platform.processor(),
    )
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[
        0
    ]
    import pyspark

    return (
        f"{os.cpu_count()} cores ({cpu}), {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"{platform.system()} {platform.release()}, {java}, PySpark {pyspark.__version__}, "
        f"Python {platform.python_version()}, Spark local[*]"
    )


def produce_avro(settings: Settings, start: datetime, n: int) -> dict:
    """The same stream in Avro (`avro-events`: a schema version mid-hour), with ~0.1 %
    records that break the wire format in place of the truncated JSON."""
    faults = Faults(
        duplicate_rate=0.01, aborted_rate=0.02, malformed_rate=0.001, open_transactions=0
    )
    m = source.produce(
        settings, start, 1, n, faults, PARTITIONS, seed=1, batch=10_000, shape="avro-events"
    )
    committed = len(m.committed_valid) + m.duplicates_sent + len(m.malformed)
    return {"committed": committed, "malformed": len(m.malformed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records",
        type=int,
        nargs="+",
        default=[500_000, 2_000_000],
        help="records per slice, one slice per size",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of W0, W1 and W2 per size, alternating"
    )
    parser.add_argument("--w3-slice", type=int, default=50_000, help="slice rows for W3")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--history-days", type=int, default=30, help="days silver's history spans")
    parser.add_argument(
        "--isolation-repeats", type=int, default=5, help="read_committed vs uncommitted reps"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=PARTS,
        help="a subset (no report)",
    )
    parser.add_argument(
        "--minute-slices", type=int, default=10, help="one-minute slices measured (after 3)"
    )
    parser.add_argument(
        "--cli-slices", type=int, default=3, help="100-record slices whose steps run by hand"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="make bench-quick: W2 and W1+ on the first size and the one-minute slices; "
        "written as quick.md and quick.json",
    )
    args = parser.parse_args()
    if args.quick:  # the rows a speed change moves, in minutes; `make bench` stays of record
        args.records, args.only = args.records[:1], args.only or list(QUICK)

    work = Path(tempfile.mkdtemp(prefix="slicewise-bench-"))
    cores = os.cpu_count() or 1
    chosen = set(args.only or PARTS)
    start = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(
        minute=0, second=0, microsecond=0
    )
    results: dict = {"slices": []}
    cache = load_settings().cache_dir
    with contextlib.ExitStack() as services:
        broker = services.enter_context(running_broker(work / "broker"))
        registry = (
            services.enter_context(LocalRegistry(work / "registry", cache))
            if "w2avro" in chosen
            else None
        )
        for n in args.records if chosen & SIZED else []:

            def env_for(name: str, n: int = n) -> dict[str, str]:
                env = bench_env(broker.bootstrap, work / str(n) / name, f"bench-{n}", cache)
                if name.startswith("w2avro") and registry is not None:
                    env |= {
                        "SLICEWISE_TOPIC": f"bench-avro-{n}",
                        "SLICEWISE_PIPELINES_FILE": str(AVRO_DEFINITION),
                        "SLICEWISE_SCHEMA_REGISTRY_URL": registry.url,
                    }
                return env

            t0 = time.perf_counter()
            produced = produce(load_settings(env_for("ref")), start, n)
            produced["seconds"] = time.perf_counter() - t0
            if registry is not None:
                produced["avro"] = produce_avro(load_settings(env_for("w2avro-ref")), start, n)
            sl = plan_slice(load_settings(env_for("ref")), start, start + timedelta(hours=1))
            ranges = {str(p): list(r) for p, r in sl.ranges.items()}
            print(f"produced {produced}; {sl.describe()}", flush=True)

            common = {"ranges": ranges, "start": start.isoformat(), "work": str(work / str(n))}
            size: dict = {"records": n, "produced": produced}
            runs: dict[str, list[dict]] = {}
            names = [name for name in ("w0", "w1", "w1plus", "w2", "w2avro") if name in chosen]
            for rep in range(args.repeats if names else 0):
                # Alternating order: no workload always runs first, or always after another.
                for name in names[rep % len(names) :] + names[: rep % len(names)]:
                    params = {**common, "env": env_for(f"{name}-{rep}"), "rounds": ROUNDS[name]}
                    runs.setdefault(name, []).append(workload(name, params, work / str(n)))
            size |= {name: median_run(rs) for name, rs in runs.items()}
            first, largest = n == args.records[0], n == max(args.records)
            if first and "airflow" in chosen:
                results["w2_airflow"] = airflow_run(
                    load_settings(env_for("w2-airflow")), start, work
                )
                for baseline in ("w1", "w1plus"):
                    results[f"{baseline}_airflow"] = airflow_w1_run(
                        load_settings(env_for(f"{baseline}-airflow")), start, work, baseline
                    )
            if first and "w3" in chosen:
                results["w3"] = workload(
                    "w3",
                    {
                        **common,
                        "env": env_for("w3"),
                        "slice_rows": args.w3_slice,
                        "scales": args.scales,
                        "dup_rates": [0.0, 0.01, 0.1],
                        "history_days": args.history_days,
                    },
                    work / str(n),
                )
            if largest and "isolation" in chosen:
                results["isolation"] = {
                    "records": n,
                    **workload(
                        "isolation",
                        {**common, "env": env_for("w0"), "repeats": args.isolation_repeats},
                        work / str(n),
                    ),
                }
            results["slices"].append(size)
        if "minute" in chosen:
            results["minute"] = minute_slices(broker.bootstrap, cache, work, args.minute_slices)
        if "cli" in chosen:
            results["cli"] = cli_steps(broker.bootstrap, cache, work, args.cli_slices)

    if args.only and not args.quick:
        print(json.dumps(results, indent=2, default=str))
        return
    from report import plot, render  # bench/report.py, beside this script

    results["machine"] = machine()
    results["when"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results["cores"] = cores
    results["args"] = {k: str(v) for k, v in vars(args).items()}
    table = render(results, TARGETS)
    print("\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "quick" if args.quick else "latest"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (args.out / f"{name}.md").write_text(table + "\n")
    if not args.quick:
        plot(results, args.out / "latest.png")
    print(f"\nwritten: {args.out / name}.md and .json (work dir {work})")


if __name__ == "__main__":
    main()
