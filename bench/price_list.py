"""The price of each guarantee: what a slice spends on it, beside the same job by hand (issue 68).

    .venv/bin/python bench/price_list.py [--slices 10] [--records 500000] [--rounds 3]

Two workloads, each in one warm in-process session, W2 and W1+ alternating:

- the one-minute slice (`make bench`'s: ~1,200 records, 3 slices of warm-up, then
  `--slices` measured), W1+ run once a minute on its own topic after each slice;
- one slice of `--records` (W2, then W1+ on fresh tables, `--rounds` times).

Every `slicewise` function and Spark's entry points are timed as `slice_profile.py`
times them, and each call's own time is credited to a guarantee: the innermost
function on its call stack that `PRICED` names decides (work handed to
`tables.side_by_side`'s threads is credited to the caller's guarantee, scaled so the
threads add up to the wall time it waited). What no priced function calls is "the
job", what W1+ does too: read Kafka, parse, bronze, quarantine, the MERGE, a GX
validation and gold. The typed parse is one Spark job with the rest, so its price is
measured apart: the slice's Kafka rows parsed the product's way and W1+'s way
(`from_json`), counted, alternating, on the cached rows.

Each Spark job is counted against the guarantee its thread was serving when it
started (the thread's job group), so each row also has its jobs a slice: a count that
does not move with the machine's load as seconds do. Jobs started with no guarantee
tagged on their thread are counted apart.

The sum of the guarantees' prices is then set beside W2 less W1+ measured in the same
runs. Writes bench/results/price-list.json and prints the table of
bench/results/price-list.md (which the closing note of the change quotes).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from run import (  # noqa: E402
    MINUTE_RECORDS,
    MINUTE_WARMUP,
    PARTITIONS,
    bench_env,
    machine,
    produce,
    produce_minutes,
)  # noqa: E402
from slice_profile import Timer, instrument, jobs_after, last_job, tag_jobs  # noqa: E402

from slicewise.config import load_settings  # noqa: E402
from slicewise.planner import plan_slice  # noqa: E402
from slicewise_dev.broker import running_broker  # noqa: E402

FROZEN = "frozen slice and its refusals (plan, Kafka's offsets, the ledger)"
TYPED = "typed quarantine (the parse beyond from_json)"
FAR = "slice_ids and far copies"
IDEMPOTENT = "per-write idempotency (finding a write's own commit)"
FENCING = "per-write idempotency (Delta's lookup of each append's id: fencing)"
WAP = "write-audit-publish (versions, verified view, records)"
GATE = "the gate: the slice's facts from the tables (GX's own call is the job's)"
GROUP = "the consumer-group commit"
JOB = "the job (what W1+ does too)"
UNTAGGED = "(jobs started where no guarantee was tagged)"

# The function (profile label) that decides the guarantee of all it calls, innermost wins.
PRICED = {
    "planner.plan_slice": FROZEN,
    "bronze.readable_ranges": FROZEN,
    "ledger.Ledger.of": FROZEN,
    "ledger.Ledger.load_slice": FROZEN,
    "ledger.Ledger.step": FROZEN,
    "ledger.Ledger.record_step": WAP,
    "ledger.Ledger.raise_verified_floor": WAP,
    "bronze.commit_bronze": JOB,
    "silver.write_slice": JOB,
    "windows.far_dates": FAR,
    "silver.settle_far_copies": FAR,
    "silver.copied_twice": FAR,
    "tables.tagged_commit": IDEMPOTENT,
    "tables.id_lookup": FENCING,
    "silver.committed_merge_metrics": IDEMPOTENT,
    "tables.of_slice": IDEMPOTENT,
    "tables.table_version": WAP,
    "commits.commits_above": WAP,
    "publish.run_publish": WAP,
    "gate.run_gate": GATE,
    "gx_adapter.validate": JOB,
    "acknowledge.acknowledge": GROUP,
}


def table_of(args: tuple) -> str | None:
    """The table a write names (its path's last folder), for the writes priced by table."""
    path = next((a for a in args[1:] if isinstance(a, str) and "/" in a), None)
    return None if path is None else Path(path).name


class Prices(Timer):
    """`Timer`'s wall times, and each call's own time credited to its guarantee."""

    def __init__(self) -> None:
        super().__init__()
        self.credit: dict[str, float] = defaultdict(float)
        # Names a thread's next Spark jobs after the guarantee it is serving (`tag_jobs`).
        self.job_tag: Callable[[str | None], None] | None = None

    def _tag(self, what: str | None) -> None:
        if self.job_tag:
            self.job_tag(what)

    def priced(self, label: str, args: tuple) -> str | None:
        if label in ("tables.history", "tables.table_version") and table_of(args) == "slice_ids":
            return FAR  # whether the far-date lookup may be reused (`silver.settle_far_copies`)
        if label in ("tables.append_once", "tables.append_slice_once", "DataFrameWriter.save"):
            # slice_ids is the key index far copies need; gold's write is W1+'s too
            return {"slice_ids": FAR, "gold_events_per_hour": JOB}.get(table_of(args))
        return PRICED.get(label)

    def reset(self) -> None:
        for counts in (self.total, self.own, self.calls):
            counts.clear()

    def functions(self, runs: int, top: int = 40) -> list[dict]:
        rows = [
            {"name": n, "own_s": self.own[n] / runs, "calls": self.calls[n] / runs}
            for n in self.own
        ]
        return sorted(rows, key=lambda r: -r["own_s"])[:top]

    def _credit(self, what: str, seconds: float) -> None:
        sink = getattr(self.local, "sink", None)
        if sink is not None:  # a thread of side_by_side: scaled when they all end
            sink[what] += seconds
            return
        with self.lock:
            self.credit[what] += seconds

    def wrap(self, name, fn):
        inner = super().wrap(name, fn)
        if name == "tables.side_by_side":
            inner = super().wrap(name, self._side_by_side)

        @functools.wraps(fn)
        def priced(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            label = name(args) if callable(name) else name
            frames = self.local.__dict__.setdefault("frames", [])
            outer = frames[-1][0] if frames else getattr(self.local, "root", JOB)
            what = self.priced(label, args) or outer
            frames.append([what, 0.0])
            self._tag(what)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                _, children = frames.pop()
                self._tag(frames[-1][0] if frames else getattr(self.local, "root", None))
                if frames:
                    frames[-1][1] += spent
                if label != "tables.side_by_side":  # its threads credit its wait
                    self._credit(what, spent - children)

        return priced

    def _side_by_side(self, *steps):
        frames = self.local.__dict__.get("frames") or [[JOB, 0.0]]
        what = frames[-1][0]
        sinks: list[dict[str, float]] = []

        def credited(step):
            def run():
                sink: dict[str, float] = defaultdict(float)
                sinks.append(sink)
                self.local.sink, self.local.root, self.local.frames = sink, what, [[what, 0.0]]
                self._tag(what)
                t0 = time.perf_counter()
                try:
                    return step()
                finally:
                    sink[what] += time.perf_counter() - t0 - self.local.frames[0][1]
                    self.local.sink = self.local.root = None
                    self.local.frames = []
                    self._tag(None)

            return run

        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(steps)) as pool:
            futures = [pool.submit(credited(step)) for step in steps]
        wall = time.perf_counter() - t0
        spent = sum(v for sink in sinks for v in sink.values()) or 1.0
        for sink in sinks:
            for key, seconds in sink.items():
                self._credit(key, seconds * wall / spent)
        return [future.result() for future in futures]


def typed_parse_price(spark, settings, slice_id: str, repeats: int = 3) -> dict:
    """The product's parse of a slice's rows (from bronze, as Kafka gave them) against
    W1+'s (`from_json`, a timestamp tried, a reason), each run to the end on the same
    cached rows, alternating; medians."""
    from pyspark.sql import functions as F
    from workloads import EVENT_SCHEMA

    from slicewise.schemas import BRONZE
    from slicewise.silver import parse
    from slicewise.tables import of_slice

    rows = of_slice(spark, settings.table("bronze"), BRONZE, slice_id).cache()
    rows.count()

    def by_hand():
        return (
            rows.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
            .select("e.*")
            .withColumn("occurred_at", F.try_to_timestamp(F.col("occurred_at")))
            .withColumn("reason", F.when(F.col("event_id").isNull(), "unparseable_or_no_key"))
        )

    seconds: dict[str, list[float]] = {"typed": [], "from_json": []}
    for _ in range(repeats):
        for name, parsed in (("typed", lambda: parse(rows, settings)), ("from_json", by_hand)):
            t0 = time.perf_counter()
            parsed().write.format("noop").mode("overwrite").save()
            seconds[name].append(time.perf_counter() - t0)
    rows.unpersist()
    return {name: statistics.median(s) for name, s in seconds.items()}


def priced_runs(runs: list[dict], key: str) -> dict[str, float]:
    """Per guarantee, the median over runs of what each run credited it."""
    names = {n for r in runs for n in r[key]}
    return {n: statistics.median(r[key].get(n, 0.0) for r in runs) for n in names}


def w2_priced(prices: Prices, spark, settings, start: datetime, end: datetime) -> dict:
    import workloads

    prices.credit.clear()
    prices.job_tag = prices.job_tag or tag_jobs(spark)
    seen = last_job(spark)
    prices.on = True
    try:
        run = workloads.w2_once(spark, settings, start, end)
    finally:
        prices.on = False
    jobs: dict[str, float] = defaultdict(float)
    for _, group, _ in jobs_after(spark, seen):
        jobs[group or UNTAGGED] += 1
    return {
        "seconds": run["seconds"],
        "steps": run["steps"],
        "credit": dict(prices.credit),
        "jobs": dict(jobs),
    }


def minute_workload(prices: Prices, spark, broker, work: Path, slices: int) -> dict:
    import workloads

    from slicewise_dev.source import produce as produce_events

    count = MINUTE_WARMUP + slices
    first = (datetime.now(timezone.utc) - timedelta(minutes=count + 5)).replace(
        second=0, microsecond=0
    )
    env = env_for(broker, work / "minute", "price-minute")
    settings = load_settings(env)
    faults = produce_minutes(settings, first, count)
    by_hand_settings = load_settings(env_for(broker, work / "minute-w1p", "price-minute-w1p"))
    job = workloads.by_hand(spark, by_hand_settings, work / "minute-w1p" / "tables")
    w2, w1p = [], []
    prices.reset()
    step = timedelta(minutes=1)
    for i in range(count):
        if i == MINUTE_WARMUP:
            prices.reset()  # the functions' table counts the measured slices only
        at = first + i * step
        run = w2_priced(prices, spark, settings, at, at + step)
        produce_events(
            by_hand_settings, at, 1, MINUTE_RECORDS, faults, PARTITIONS, seed=i,
            batch=1_000, interval=step, id_prefix=f"m{i}-",
        )  # fmt: skip
        out = job()
        if i >= MINUTE_WARMUP:
            w2.append(run)
            w1p.append(out["seconds"])
    last = first + (count - 1) * step
    slice_id = plan_slice(settings, last, last + step).slice_id  # frozen: the same slice
    return summary(w2, w1p, typed_parse_price(spark, settings, slice_id), MINUTE_RECORDS, prices)


def price_id_lookups(prices: Prices) -> None:
    """Time apart Delta's lookup of each append's idempotent-write id.

    An append with a `txnAppId` (`tables.append_once`: bronze, quarantine, `slice_ids`)
    asks the snapshot it writes on for its set transactions, and Delta 4.4 computes them
    by aggregating the table's whole state (`SnapshotState.setTransactions`, a few Spark
    jobs), inside the writer's save: priced with the job it would be the job's. So each
    append first makes that lookup here, on the same snapshot (nothing commits in
    between), and the save then finds it computed. (The MERGE's and gold's writes read
    their table's state anyway; their lookups stay in their rows.)"""

    import slicewise.bronze
    import slicewise.tables

    def id_lookup(spark, path: str) -> None:
        if not (Path(path) / "_delta_log").is_dir():
            return  # the first write creates the table: no state to look in
        jvm, none = spark.sparkContext._jvm, spark.sparkContext._jvm.scala.Option.empty()
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
        log.update(False, none, none).setTransactions()

    lookup = prices.wrap("tables.id_lookup", id_lookup)
    append_once = slicewise.tables.append_once

    @functools.wraps(append_once)
    def looked_up_first(df, path: str, app_id: str, metadata: dict) -> None:
        lookup(df.sparkSession, path)
        return append_once(df, path, app_id, metadata)

    slicewise.tables.append_once = slicewise.bronze.append_once = looked_up_first


def sized_workload(prices: Prices, spark, broker, work: Path, records: int, rounds: int) -> dict:
    import workloads

    start = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(
        minute=0, second=0, microsecond=0
    )
    topic = f"price-{records}"
    produce(load_settings(env_for(broker, work / "ref", topic)), start, records)
    w2, w1p = [], []
    prices.reset()
    settings = None
    for n in range(rounds):
        settings = load_settings(env_for(broker, work / f"w2-{n}", topic))
        w2.append(w2_priced(prices, spark, settings, start, start + timedelta(hours=1)))
        w1p.append(workloads.w1plus_once(spark, settings, work / f"w1p-{n}")["seconds"])
    slice_id = plan_slice(settings, start, start + timedelta(hours=1)).slice_id
    return summary(w2, w1p, typed_parse_price(spark, settings, slice_id), records, prices)


def summary(w2: list[dict], w1p: list[float], typed: dict, records: int, prices: Prices) -> dict:
    credit = priced_runs(w2, "credit")
    # The typed parse runs inside the job's first write: move its excess out of the job.
    extra = max(typed["typed"] - typed["from_json"], 0.0)
    credit[TYPED] = credit.get(TYPED, 0.0) + extra
    credit[JOB] = credit.get(JOB, 0.0) - extra
    w2_s, w1p_s = statistics.median(r["seconds"] for r in w2), statistics.median(w1p)
    guarantees = {k: v for k, v in credit.items() if k != JOB}
    return {
        "records": records,
        "w2_seconds": w2_s,
        "w1plus_seconds": w1p_s,
        "w2_runs": [r["seconds"] for r in w2],
        "w1plus_runs": w1p,
        "steps": {k: statistics.median(r["steps"][k] for r in w2) for k in w2[0]["steps"]},
        "typed_parse": typed,
        "prices": dict(sorted(guarantees.items(), key=lambda kv: -kv[1])),
        # Spark jobs a slice (medians) by the guarantee whose function started them: they
        # do not move with the machine's load as seconds do.
        "jobs": priced_runs(w2, "jobs"),
        "job": credit.get(JOB, 0.0),
        "sum_of_prices": sum(guarantees.values()),
        "w2_less_w1plus": w2_s - w1p_s,
        "functions": prices.functions(len(w2)),  # where to cut: own seconds a slice
    }


def env_for(broker, state: Path, topic: str) -> dict[str, str]:
    return bench_env(broker.bootstrap, state, topic, load_settings().cache_dir)


def table(results: dict) -> str:
    sizes = list(results["workloads"].values())
    head = " | ".join(f"{r['records']:,} records: s | jobs" for r in sizes)
    lines = [f"| guarantee | {head} |", "|---|" + "---:|---:|" * len(sizes)]

    def row(label: str, seconds, jobs) -> str:
        cells = (f"{seconds(r):.2f} | {jobs(r):.0f}" for r in sizes)
        return f"| {label} | " + " | ".join(cells) + " |"

    for name in sizes[0]["prices"]:
        lines.append(
            row(
                name, lambda r, n=name: r["prices"].get(n, 0), lambda r, n=name: r["jobs"].get(n, 0)
            )
        )
    lines.append(
        row(
            "**sum of the prices**",
            lambda r: r["sum_of_prices"],
            lambda r: sum(v for k, v in r["jobs"].items() if k not in (JOB, UNTAGGED)),
        )
    )
    lines.append(row(JOB, lambda r: r["job"], lambda r: r["jobs"].get(JOB, 0)))
    lines.append(
        row(
            "W2 (plan to publish); jobs no guarantee started",
            lambda r: r["w2_seconds"],
            lambda r: r["jobs"].get(UNTAGGED, 0),
        )
    )
    for label, key in (("W2 less W1+, same runs", "w2_less_w1plus"), ("W1+", "w1plus_seconds")):
        lines.append(f"| {label} | " + " | ".join(f"{r[key]:.2f} | " for r in sizes) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=10, help="one-minute slices measured")
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/price-list.json"))
    args = parser.parse_args()
    prices = Prices()
    instrument(prices)
    import workloads  # the bench's own session factory (after instrumenting)

    price_id_lookups(prices)

    work = Path(tempfile.mkdtemp(prefix="slicewise-prices-"))
    with running_broker(work / "broker") as broker:
        spark = workloads.session(load_settings(env_for(broker, work / "session", "price-x")))
        results = {
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "workloads": {
                "minute": minute_workload(prices, spark, broker, work, args.slices),
                "sized": sized_workload(prices, spark, broker, work, args.records, args.rounds),
            },
        }
    results["table"] = table(results)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(report(results, args))
    print(results["table"])


def report(results: dict, args: argparse.Namespace) -> str:
    minute, sized = results["workloads"]["minute"], results["workloads"]["sized"]
    command = (
        f"`.venv/bin/python bench/price_list.py --slices {args.slices} "
        f"--records {args.records} --rounds {args.rounds}`"
    )
    typed = {k: (minute["typed_parse"][k], sized["typed_parse"][k]) for k in ("typed", "from_json")}
    return f"""# The price of each guarantee (`make bench-prices`), {results["when"][:16]} UTC

Machine: {machine()}.

Command: {command}; how it prices: the docstring of `bench/price_list.py`.

Seconds a slice, W2 on a warm in-process session, W1+ on the same session alternating
with it: the one-minute slice (~{minute["records"]:,} records, medians of {args.slices} after
{MINUTE_WARMUP}) and one slice of {sized["records"]:,} records (medians of {args.rounds}, each on
fresh tables). A guarantee's row is what the functions that serve it spent, Spark's
jobs and commits included; the job's row is the rest, the work W1+ does too.

{results["table"]}

- The typed parse alone, on the same cached rows: the product's {typed["typed"][0]:.2f} s
  and {typed["typed"][1]:.2f} s, W1+'s `from_json` {typed["from_json"][0]:.2f} s and
  {typed["from_json"][1]:.2f} s.
- W2's steps: one-minute {steps(minute)}; {sized["records"]:,} records {steps(sized)}.
"""


def steps(result: dict) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in result["steps"].items())


if __name__ == "__main__":
    main()
