"""Where a one-minute slice's time goes, by the product function that spends it (issue 68).

    .venv/bin/python bench/slice_profile.py [--slices 10] [--out bench/results/slice-profile.json]

The workload is `make bench`'s one-minute slice (`bench/workloads.py` `minute`: ~1,200
records a slice, the same faults, one warm in-process session, 3 slices of warm-up),
with every module-level function of `slicewise` wrapped by a wall-clock timer, and
Spark's own entry points too (`spark.sql` by its statement's first word, DataFrame
actions, writer saves), so each is a leaf. A function's *own* time is its wall time
less the timed functions it called in the same thread: the own times of one thread add
up to the step. Work handed to a second thread (`tables.side_by_side`) is timed in that
thread and also shows as `side_by_side`'s wait, so those rows overlap.

Each Spark job is counted against the innermost timed function running on the thread
that started it (the wrappers set the thread's job group), and the process's CPU time
(Python's and its JVM's) is read around the timed slices: a slice's job count does not
move with the machine's load as its wall time does, so a cut of a few jobs shows there
first.

Timing wrappers cost a few microseconds a call against calls of milliseconds; the
slice's total here is within the noise of `make bench-quick`'s.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import pkgutil
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import FunctionType

sys.path.insert(0, str(Path(__file__).parent))

from run import MINUTE_RECORDS, MINUTE_WARMUP, produce_minutes  # noqa: E402

import slicewise  # noqa: E402
from slicewise.config import load_settings  # noqa: E402
from slicewise_dev.broker import running_broker  # noqa: E402


class Timer:
    """Wall time per name, inclusive and own (less timed callees in the same thread)."""

    def __init__(self) -> None:
        self.on = False
        self.local = threading.local()
        self.lock = threading.Lock()
        self.total: dict[str, float] = defaultdict(float)
        self.own: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        # Called with the innermost timed function's name as it changes on a thread (None
        # when no timed function is running there): `main` tags that thread's Spark jobs.
        self.tag: Callable[[str | None], None] | None = None

    def wrap(self, name, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            label = name(args) if callable(name) else name
            stack = self.local.__dict__.setdefault("stack", [])
            labels = self.local.__dict__.setdefault("labels", [])
            stack.append(0.0)
            labels.append(label)
            if self.tag:
                self.tag(label)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                labels.pop()
                if self.tag:
                    self.tag(labels[-1] if labels else None)
                children = stack.pop()
                if stack:
                    stack[-1] += spent
                with self.lock:
                    self.total[label] += spent
                    self.own[label] += spent - children
                    self.calls[label] += 1

        return timed


def instrument(timer: Timer) -> None:
    """Every slicewise module's functions, replaced wherever a slicewise module names them."""
    modules = [slicewise]
    for info in pkgutil.walk_packages(slicewise.__path__, "slicewise."):
        if info.name.endswith(("preloaded_scheduler", "operators", "cli")):
            continue  # Airflow's side: not on a step's path here
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError:
            continue
    wrapped: dict[int, object] = {}
    for module in modules:
        for attr, value in vars(module).items():
            if (
                isinstance(value, FunctionType)
                and value.__module__ == module.__name__
                and id(value) not in wrapped
            ):
                short = module.__name__.removeprefix("slicewise.")
                wrapped[id(value)] = timer.wrap(f"{short}.{attr}", value)
    for module in modules:
        for attr, value in list(vars(module).items()):
            if id(value) in wrapped:
                setattr(module, attr, wrapped[id(value)])
            elif isinstance(value, type) and value.__module__ == module.__name__:
                short = module.__name__.removeprefix("slicewise.")
                for name, method in list(vars(value).items()):
                    if isinstance(method, FunctionType) and not name.startswith("__"):
                        setattr(value, name, timer.wrap(f"{short}.{attr}.{name}", method))

    from pyspark.sql import DataFrame, DataFrameWriter, SparkSession

    def statement(args) -> str:
        words = str(args[1]).split()
        return f"spark.sql {words[0].upper() if words else '?'}"

    SparkSession.sql = timer.wrap(statement, SparkSession.sql)
    for action in ("collect", "first", "count", "toPandas", "take", "head", "isEmpty"):
        setattr(DataFrame, action, timer.wrap(f"DataFrame.{action}", getattr(DataFrame, action)))
    for save in ("save", "saveAsTable", "insertInto"):
        setattr(
            DataFrameWriter,
            save,
            timer.wrap(f"DataFrameWriter.{save}", getattr(DataFrameWriter, save)),
        )


def jobs_after(spark, after: int) -> list[tuple[int, str | None, str]]:
    """Spark's jobs with ids above `after` (ids count up; the status store keeps the
    newest): each id with its job group, the timed function that ran it (`tag_jobs`),
    and what the job did: its description where the code that started it set one
    (Delta names its own, e.g. "Compute snapshot for version: 12"), else its call site,
    digits blanked so that the same work on another version counts as one."""
    jobs = spark._jsc.sc().statusStore().jobsList(None)
    found = []
    for i in range(jobs.size()):
        job = jobs.apply(i)
        if job.jobId() > after:
            group, description = job.jobGroup(), job.description()
            what = description.get() if description.isDefined() else job.name()
            found.append(
                (
                    job.jobId(),
                    group.get() if group.isDefined() else None,
                    re.sub(r"\d+", "#", what.splitlines()[0])[:90],
                )
            )
    return found


def last_job(spark) -> int:
    return max((job for job, _, _ in jobs_after(spark, -1)), default=-1)


def tag_jobs(spark) -> Callable[[str | None], None]:
    """Names the calling thread's next Spark jobs (their job group) after a function."""
    sc = spark.sparkContext

    def tag(label: str | None) -> None:
        sc.setLocalProperty("spark.jobGroup.id", label)

    return tag


def cpu_seconds(spark) -> float:
    """CPU time of this process and its JVM (user and system), as the kernel counts it."""
    own = sum(os.times()[:2])
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return own + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("bench/results/slice-profile.json"))
    args = parser.parse_args()
    timer = Timer()
    instrument(timer)
    import workloads  # the bench's own session factory and slice (after instrumenting)

    work = Path(tempfile.mkdtemp(prefix="slicewise-profile-"))
    count = MINUTE_WARMUP + args.slices
    first = (datetime.now(timezone.utc) - timedelta(minutes=count + 5)).replace(
        second=0, microsecond=0
    )
    with running_broker(work / "broker") as broker:
        env = {
            "SLICEWISE_KAFKA_BOOTSTRAP": broker.bootstrap,
            "SLICEWISE_STATE_DIR": str(work / "state"),
            "SLICEWISE_TOPIC": "profile-minute",
            "SLICEWISE_GRACE_SECONDS": "0",
        }
        settings = load_settings(env)
        produce_minutes(settings, first, count)
        spark = workloads.session(settings)
        # Spark's own count of generated classes compiled (its cache's misses).
        compiled = (
            spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
        )
        timer.tag = tag_jobs(spark)
        per_slice, jobs_of, jobs_doing = [], defaultdict(int), defaultdict(int)
        for i in range(count):
            at = first + i * timedelta(minutes=1)
            timer.on = i >= MINUTE_WARMUP
            if i == MINUTE_WARMUP:
                compiled_before = compiled.getCount()
                seen, cpu_before = last_job(spark), cpu_seconds(spark)
            run = workloads.w2_once(spark, settings, at, at + timedelta(minutes=1))
            if timer.on:
                per_slice.append(run["seconds"])
                new = jobs_after(spark, seen)  # after each slice: the store keeps 1,000
                for _, group, what in new:
                    jobs_of[group or "(untimed)"] += 1
                    jobs_doing[(group or "(untimed)", what)] += 1
                seen = max([seen, *(job for job, _, _ in new)])
        timer.on = False
        compilations = (compiled.getCount() - compiled_before) / args.slices
        jobs = sum(jobs_of.values()) / args.slices
        cpu = (cpu_seconds(spark) - cpu_before) / args.slices
    n = args.slices
    rows = sorted(
        (
            {
                "name": name,
                "own_s": timer.own[name] / n,
                "total_s": timer.total[name] / n,
                "calls": timer.calls[name] / n,
                "spark_jobs": jobs_of.get(name, 0) / n,  # those it ran itself
            }
            for name in {*timer.total, *jobs_of}
        ),
        key=lambda r: -r["own_s"],
    )
    result = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "slices": n,
        "records": MINUTE_RECORDS,
        "slice_seconds_median": statistics.median(per_slice),
        "codegen_compilations_per_slice": compilations,
        # Less noisy than wall time on a shared machine: what a cut must lower.
        "spark_jobs_per_slice": jobs,
        "cpu_seconds_per_slice": cpu,
        "steps": {
            s: timer.total.get(f"{m}.{s}", 0) / n
            for m, s in (
                ("planner", "plan_slice"),
                ("ingest", "run_ingest"),
                ("gate", "run_gate"),
                ("publish", "run_publish"),
            )
        },
        "functions": rows,
        # What the jobs did, per function that started them (per slice).
        "jobs_by_work": [
            {"function": f, "work": w, "jobs": c / n}
            for (f, w), c in sorted(jobs_doing.items(), key=lambda kv: -kv[1])
        ],
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"slice median {result['slice_seconds_median']:.2f} s; steps " + ", ".join(
        f"{k} {v:.2f}" for k, v in result["steps"].items())
        + f"; {compilations:.1f} classes compiled, {jobs:.1f} Spark jobs, "
        f"{cpu:.2f} s of CPU a slice")  # fmt: skip
    print(
        f"{'own s':>7} {'total s':>8} {'calls':>6} {'jobs':>5}  function (per slice, mean of {n})"
    )
    for r in rows[:45]:
        print(
            f"{r['own_s']:7.3f} {r['total_s']:8.3f} {r['calls']:6.1f} {r['spark_jobs']:5.1f}"
            f"  {r['name']}"
        )
    print(f"{'jobs':>5}  what they did, by the function that started them (per slice)")
    for r in result["jobs_by_work"][:30]:
        print(f"{r['jobs']:5.1f}  {r['function']}: {r['work']}")


if __name__ == "__main__":
    main()
