"""Chaos: kill -9, zombie and orphaned attempts, broker and Spark Connect server restarts
and table maintenance at every step, against an oracle.

Each run produces a faulty stream with `slicewise_dev.source` (duplicates, aborted and
long-open transactions, poison records, fields that changed type, new fields) on the
suite's own broker and takes one slice through the steps as Airflow runs them, one
process per attempt: `slicewise plan`, then `slicewise <step>`, a client of the suite's
own Spark Connect server (as the DAG's tasks are), each in its own process group so
that SIGKILL takes the whole task at once while the server may finish its write.
After the chaos, retries run until the step succeeds, and the tables are compared
with the oracle: silver holds exactly the committed valid event_ids, once each;
quarantine holds exactly the malformed offsets; the counts reconcile (the gate
passed) and gold counts every silver row once.

    make chaos                       # SLICEWISE_CHAOS_RUNS=5 runs per scenario, recorded
    make chaos SCENARIOS=zombie,mixed RUNS=3   # the scenarios a change exercises
    SLICEWISE_CHAOS_SEED=1234 make chaos SCENARIOS=zombie RUNS=1  # replay a failed run
    SLICEWISE_CHAOS_STORE=s3 ...     # lakehouse and ledger in a bucket of the tests' s3proxy
    make chaos-report                # the table of every run recorded so far (chaos_log.py)

`make test` (and so CI) runs one run of the mixed scenario (a random strike per step),
unrecorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from attempts import Attempt, Forker
from chaos_log import SCENARIOS, Row, append, render
from pyspark.sql import functions as F
from shared_services import TEST_SERVER_JVM
from sqlalchemy import text

from slicewise.config import Settings, load_settings
from slicewise.connect_auth import TOKEN_ENV
from slicewise.connect_server import SparkConnectServer, connect_connection
from slicewise.faults import POINTS
from slicewise.home import REPO_ROOT
from slicewise.ledger import Ledger
from slicewise.tables import table_exists
from slicewise_dev.airflow_env import VENV_BIN, airflow_env
from slicewise_dev.airflow_services import DAG_ID, AirflowServices, Celery
from slicewise_dev.broker import LocalBroker, free_ports, running_broker
from slicewise_dev.netns import Hosts
from slicewise_dev.producer import Record, TxProducer, ensure_topic, event_value
from slicewise_dev.redis import LocalRedis
from slicewise_dev.source import TYPES, Faults, Manifest, produce

pytestmark = pytest.mark.integration

RUNS = int(os.environ.get("SLICEWISE_CHAOS_RUNS", "1"))
STORE = os.environ.get("SLICEWISE_CHAOS_STORE", "local")  # or "s3": the tests' S3 server
KILLED = -signal.SIGKILL  # Popen.returncode of a process that died of SIGKILL
FAULTS = Faults(duplicate_rate=0.05, aborted_rate=0.1, malformed_rate=0.03, drift_rate=0.05)
ATTEMPTS = 6  # ingest passes four fault points (bronze's, silver's three), so it may need a fifth try; one spare
STEPS = ("plan", "ingest", "gate", "publish")  # the DAG's


class Slice:
    """One slice of one run: its settings, its broker, its interval, and a log per attempt."""

    forker: Forker | None = None  # the module's fork server (`forked_attempts`), if any

    def __init__(
        self,
        settings: Settings,
        broker: LocalBroker,
        server: SparkConnectServer,
        start: datetime,
        logs: Path,
    ):
        self.settings, self.broker, self.server = settings, broker, server
        self.start, self.logs = start, logs
        # About 100 records a partition: tasks of 40 split every range, as the default
        # splits a production slice of millions.
        self.env = {**airflow_env(settings), "SLICEWISE_RECORDS_PER_TASK": "40"}
        self.slice_id = ""
        self.attempts = 0

    def launch(
        self, step: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen | Attempt:
        """One attempt of a step as Airflow would start it, in a process group of its own."""
        if step == "plan":
            end = self.start + timedelta(hours=1)
            cmd = [str(VENV_BIN / "slicewise"), "plan", "--start", self.start.isoformat()]
            cmd += ["--end", end.isoformat()]
        elif step == "maintain":
            cmd = [str(VENV_BIN / "slicewise"), "maintain"]
        else:
            cmd = [str(VENV_BIN / "slicewise"), step, "--slice-id", self.slice_id]
        self.attempts += 1
        log = self.logs / f"{self.attempts:02d}-{step}.log"
        env = {**self.env, **(extra_env or {})}
        if self.forker is not None:  # forked from the preloaded server (attempts.py)
            return self.forker.launch(cmd[1:], env, log)
        with log.open("w") as out:  # the child keeps its own descriptor
            return subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def signal(self, proc: subprocess.Popen | Attempt, sig: signal.Signals) -> bool:
        """Send `sig` to the attempt's process group; False if the attempt had already
        ended (a forked attempt is reaped at once: its group is gone, its pid reusable)."""
        if proc.poll() is not None:
            return False
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def outlives(self, proc: subprocess.Popen, seconds: float) -> bool:
        """True if `proc` is still running after `seconds` (so chaos can strike)."""
        try:
            proc.wait(timeout=seconds)
            return False
        except subprocess.TimeoutExpired:
            return True

    def done(self, step: str) -> None:
        if step == "plan":
            [self.slice_id] = [s.slice_id for s in self.ledger().slices() if s.start == self.start]

    def retry_until_done(
        self, step: str, extra_env: dict[str, str] | None = None, timed: bool = False
    ) -> int:
        """Attempts until one succeeds (what Airflow's retries do); returns how many were
        killed. `timed`: a first attempt that succeeds is a clean one (`CLEAN_SECONDS`)."""
        killed = 0
        for tried in range(ATTEMPTS):
            began = time.monotonic()
            code = self.launch(step, extra_env).wait(timeout=900)
            if code == 0:
                if timed and not tried and step in CLEAN_SECONDS:
                    CLEAN_SECONDS[step].append(time.monotonic() - began)
                self.done(step)
                return killed
            killed += code == KILLED
        log = sorted(self.logs.glob(f"*-{step}.log"))[-1].read_text()[-3000:]
        raise AssertionError(f"{step} failed {ATTEMPTS} times in a row; last log:\n{log}")

    def ledger(self) -> Ledger:
        return Ledger(self.settings.ledger_dir, self.settings.topic)


# Seconds a clean attempt of each step takes, forked (attempts.py) as a client of a warm
# server on a 2-core machine; strikes are drawn over that span. Once this worker has timed
# clean attempts of a step (`no_strike`), the median of its latest ones replaces the
# figure: a step takes longer under a loaded batch than on a quiet machine. Fixed figures
# from the days each attempt was a fresh process (gate 12 s, publish 7 s) drew many
# strikes after the step had ended: server-restart struck none of its 5 runs on
# 2026-12-03 and 3 of 5 on 2026-12-04, when a clean gate took 4-7 s and publish 2-4 s.
STEP_SECONDS = {"plan": 2.5, "ingest": 12.0, "gate": 4.5, "publish": 2.5}
CLEAN_SECONDS: dict[str, deque[float]] = {step: deque(maxlen=9) for step in STEP_SECONDS}


def strike_after(rng: random.Random, step: str) -> float:
    """A random moment in a step's first attempt, from its first second to its last."""
    timed = CLEAN_SECONDS[step]
    return rng.uniform(0.1, 0.95) * (statistics.median(timed) if timed else STEP_SECONDS[step])


# A strike: one step of the slice under one kind of chaos, run until the step is done;
# returns how many attempts it struck (killed, frozen, or cut off by a broker restart).
Strike = Callable[[Slice, str, random.Random], int]


def kill_at_boundary(sl: Slice, step: str, rng: random.Random) -> int:
    """SIGKILL right after the step's write committed and before it was recorded."""
    env = {"SLICEWISE_FAULTS": ",".join(POINTS), "SLICEWISE_FAULT_ACTION": "kill"}
    return sl.retry_until_done(step, env)


def kill_mid_step(sl: Slice, step: str, rng: random.Random) -> int:
    """SIGKILL the first attempt at a random moment, often in the middle of a write."""
    first = sl.launch(step)
    struck = sl.outlives(first, strike_after(rng, step)) and sl.signal(first, signal.SIGKILL)
    if first.wait() == 0:
        sl.done(step)
    else:
        sl.retry_until_done(step)
    return int(struck)


def zombie(sl: Slice, step: str, rng: random.Random) -> int:
    """The first attempt freezes (SIGSTOP) at a random moment; its retry runs to the end;
    then the zombie wakes up (SIGCONT) and finishes whatever it was doing."""
    first = sl.launch(step)
    struck = sl.outlives(first, strike_after(rng, step)) and sl.signal(first, signal.SIGSTOP)
    if struck:
        sl.retry_until_done(step)
        sl.signal(first, signal.SIGCONT)
        first.wait(timeout=900)  # a no-op success or a clean failure: either is fine
    elif first.wait() == 0:  # it ended before the strike
        sl.done(step)
    else:
        sl.retry_until_done(step)
    return int(struck)


def orphan(sl: Slice, step: str, rng: random.Random) -> int:
    """Airflow loses an attempt (its worker dies, the process lives on) and starts the
    retry at a random moment while the orphan still writes; both run to the end. As in
    Airflow, only the retry's outcome counts; if it fails, it is retried."""
    first = sl.launch(step)
    struck = sl.outlives(first, strike_after(rng, step))
    if struck:
        retry = sl.launch(step)
        first.wait(timeout=900)  # a success, a no-op or a clean conflict: all fine
        code = retry.wait(timeout=900)
    else:
        code = first.returncode
    if code == 0:
        sl.done(step)
    else:
        sl.retry_until_done(step)
    return int(struck)


# When plan and ingest talk to Kafka, in seconds after launch on a 2-core machine: plan
# once its imports are done, ingest once its session is open. A strike drawn over a whole
# step (strike_after) often came after the read, or after the step had ended.
KAFKA_READS = {"plan": (0.5, 2.0), "ingest": (2.0, 7.0)}


def broker_restart(sl: Slice, step: str, rng: random.Random) -> int:
    """The broker goes down (SIGTERM) at a random moment while a step that reads Kafka
    (plan, ingest) runs, stays down 0-20 s, and comes back on the same data; if the attempt
    failed, it is retried."""
    first = sl.launch(step)
    struck = step in KAFKA_READS and sl.outlives(first, rng.uniform(*KAFKA_READS[step]))
    if struck:
        sl.broker.stop()
        time.sleep(rng.uniform(0, 20))
        sl.broker.start(timeout=120)
    if first.wait(timeout=900) == 0:
        sl.done(step)
    else:
        sl.retry_until_done(step)
    return int(struck)


def client_killed(sl: Slice, step: str, rng: random.Random) -> int:
    """The task (the Connect client) dies of SIGKILL mid-step and its retry starts at
    once, while the server still runs the dead client's operation to its end (it is
    detached, not cancelled): the retry races the server-side write."""
    first = sl.launch(step)
    struck = sl.outlives(first, strike_after(rng, step)) and sl.signal(first, signal.SIGKILL)
    if struck:
        first.wait()
        sl.retry_until_done(step)
    elif first.wait() == 0:  # it ended before the strike
        sl.done(step)
    else:
        sl.retry_until_done(step)
    return int(struck)


def server_restart(sl: Slice, step: str, rng: random.Random) -> int:
    """The Spark Connect server dies (SIGKILL) mid-step and comes back 0-5 s later; the
    attempt fails with it (or had finished) and its retry runs on the new server.
    Plan runs no Spark, so it is never struck."""
    first = sl.launch(step)
    struck = step != "plan" and sl.outlives(first, strike_after(rng, step))
    if struck:
        sl.server.kill()
        time.sleep(rng.uniform(0, 5))
        sl.server.start()
    if first.wait(timeout=900) == 0:
        sl.done(step)
    else:
        sl.retry_until_done(step)
    return int(struck)


def two_clients(sl: Slice, step: str, rng: random.Random) -> int:
    """Two clients of one slice start together (a cleared task beside a retry, or two
    on-call engineers): both run to the end on the one server; what counts is that one
    succeeds and the tables end as if one ran."""
    a, b = sl.launch(step), sl.launch(step)
    codes = [a.wait(timeout=900), b.wait(timeout=900)]
    if 0 in codes:
        sl.done(step)
    else:
        sl.retry_until_done(step)
    return 1


def beside_maintenance(sl: Slice, step: str, rng: random.Random) -> int:
    """The pipeline's maintenance (compaction, deletion-vector purge, bronze retention,
    VACUUM with a retention as short as the step timeout) starts at a random moment of
    the step; both run to the end, and a failed attempt of either is retried, as Airflow
    retries each DAG's task. Plan writes no table, so it runs alone."""
    if step == "plan":
        return no_strike(sl, step, rng)
    first = sl.launch(step)
    struck = sl.outlives(first, strike_after(rng, step))
    upkeep = sl.launch("maintain")
    code, maintained = first.wait(timeout=900), upkeep.wait(timeout=900)
    if code == 0:
        sl.done(step)
    else:
        sl.retry_until_done(step)
    if maintained != 0:
        sl.retry_until_done("maintain")
    return int(struck)


STRIKES: dict[str, Strike] = {
    "boundary": kill_at_boundary,
    "mid-step": kill_mid_step,
    "zombie": zombie,
    "orphan": orphan,
    "broker-restart": broker_restart,
    "client-killed": client_killed,
    "server-restart": server_restart,
    "two-clients": two_clients,
    "maintenance": beside_maintenance,
}
MIXED = "mixed"
FAILED_GATE = "failed-gate"  # a slice's gate fails while the next one arrives (mixed strikes)
RACING_COPY = "racing-copy"  # a writer stores a copy of a key just before silver's MERGE
WORKER_KILLED = "worker-killed"  # through Airflow: a CeleryExecutor worker on another host
RETRIED_MERGE = "retried-merge"  # a MERGE killed before its record, a failing gate, a publication
SHARED_TOPIC = "shared-topic"  # two pipelines on one topic under one SLICEWISE_LEDGER_DIR
SCHEDULER_AWAY = "scheduler-away"  # through Airflow's scheduler: intervals it skipped
assert set(SCENARIOS) == {
    *STRIKES, MIXED, FAILED_GATE, RACING_COPY, WORKER_KILLED, RETRIED_MERGE, SHARED_TOPIC,
    SCHEDULER_AWAY,
}  # fmt: skip


def chosen_scenarios() -> list[str]:
    """`make chaos` runs every scenario (or SLICEWISE_CHAOS_SCENARIOS); `make test` (CI)
    one randomized run of the mixed one."""
    if names := os.environ.get("SLICEWISE_CHAOS_SCENARIOS"):
        chosen = [name.strip() for name in names.split(",") if name.strip()]
        if unknown := set(chosen) - set(SCENARIOS):
            raise pytest.UsageError(
                f"SLICEWISE_CHAOS_SCENARIOS: unknown {sorted(unknown)}; choose from "
                f"{', '.join(SCENARIOS)}"
            )
        return chosen
    return list(SCENARIOS) if "SLICEWISE_CHAOS_RUNS" in os.environ else [MIXED]


def no_strike(sl: Slice, step: str, rng: random.Random) -> int:
    sl.retry_until_done(step, timed=True)
    return 0


def strike(scenario: str, sl: Slice, rng: random.Random) -> int:
    # A server restart costs a cold JVM (about a minute on 2 cores), so its scenario
    # strikes one step per run, drawn at random (the next, if it ended before the strike);
    # the others strike every step.
    once = rng.choice(STEPS[1:]) if scenario == "server-restart" else None
    struck = 0
    for step in STEPS:
        kind = rng.choice(list(STRIKES)) if scenario in (MIXED, FAILED_GATE) else scenario
        hit = (no_strike if once not in (None, step) else STRIKES[kind])(sl, step, rng)
        if once == step and not hit and step != STEPS[-1]:
            once = STEPS[STEPS.index(step) + 1]  # it ended before the strike: the next one
        struck += hit
    return struck


def maintained_backfill(state: Path) -> dict[str, str]:
    """The maintenance scenario's settings: slices two days back (a backfill) whose event
    date is settled for a horizon of 0 days, so maintenance compacts and purges silver's
    partition while a slice MERGEs into it; VACUUM's retention as short as the step
    timeout (30 s, longer than any attempt here), and bronze retention of a day, so it
    also deletes files and rows beside the steps."""
    doc = yaml.safe_load((REPO_ROOT / "pipelines.yaml").read_text())
    events = doc["pipelines"]["events"]
    events["horizon_days"] = 0
    events["maintenance"] = {"vacuum_retain": "30s", "bronze_retain": "1d"}
    state.mkdir(parents=True, exist_ok=True)
    path = state / "pipelines.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return {"SLICEWISE_PIPELINES_FILE": str(path), "SLICEWISE_STEP_TIMEOUT": "30s"}


@pytest.fixture(scope="module", autouse=True)
def forked_attempts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forker]:
    """Every attempt of the module forked from one preloaded process (attempts.py)."""
    with Forker(tmp_path_factory.mktemp("forker") / "forker.log") as forker:
        Slice.forker = forker
        try:
            yield forker
        finally:
            Slice.forker = None


@pytest.fixture(scope="module")
def chaos_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A broker of the suite's own, which it may restart without disturbing other tests."""
    with running_broker(tmp_path_factory.mktemp("chaos-kafka")) as broker:
        yield broker


@pytest.fixture(scope="module")
def chaos_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkConnectServer]:
    """A Spark Connect server of the suite's own, which it may kill and restart."""
    (port,) = free_ports(1)
    server = SparkConnectServer(
        tmp_path_factory.mktemp("chaos-spark"), port, "local[2]", extra_conf=TEST_SERVER_JVM
    )
    server.start()
    yield server
    server.stop()


TABLE: list[Row] = []  # one row per scenario of this session, printed after each


POSITION_OF_A_BAD_COPY = 10**9  # a Kafka offset no test topic reaches


def held_back(
    spark,
    settings: Settings,
    broker: LocalBroker,
    server: SparkConnectServer,
    start: datetime,
    logs: Path,
    env: dict[str, str],
    rng: random.Random,
    row: Row,
) -> tuple[Slice, Slice]:
    """Write-audit-publish under chaos. Slice A (the first hour) is ingested, then a
    second copy of one of its events is written into silver, as a bad manual write
    would: its gate fails. Slice B (the next hour) arrives and passes its own gate, but
    its publication is refused: gold and the consumer group hold nothing of either.
    Then on-call repairs silver (the copy at the higher position goes), A's gate passes,
    and both publish. Every step of both slices but A's failing gate is struck (a random
    kind each), as in the mixed scenario."""
    a, b = (
        Slice(settings, broker, server, start + timedelta(hours=h), logs / name)
        for h, name in ((0, "a"), (1, "b"))
    )
    for sl in (a, b):
        sl.logs.mkdir()
        sl.env.update(env)
    for sl in (a, b):
        for step in ("plan", "ingest"):
            row.struck += STRIKES[rng.choice(list(STRIKES))](sl, step, rng)
    # A second copy of an event only A holds (B's gate must not see it), at a position
    # no record has: silver's rows are what a bad manual write would leave.
    silver_path = settings.table("silver")
    ids = spark.read.format("delta").load(settings.table("slice_ids"))
    only_a = ids.where(F.col("slice_id") == a.slice_id).join(
        ids.where(F.col("slice_id") == b.slice_id), "event_id", "left_anti"
    )
    silver = spark.read.format("delta").load(silver_path)
    copy = silver.join(only_a.select("event_id").limit(1), "event_id", "left_semi")
    copy = copy.withColumn("kafka_offset", F.lit(POSITION_OF_A_BAD_COPY).cast("long"))
    copy.select(*silver.columns).write.format("delta").mode("append").save(silver_path)
    assert a.launch("gate").wait(timeout=900) == 1, "the gate passed a duplicate"
    row.struck += STRIKES[rng.choice(list(STRIKES))](b, "gate", rng)
    refused = b.launch("publish")
    assert refused.wait(timeout=900) == 1
    assert "NOT published" in sorted(b.logs.glob("*-publish.log"))[-1].read_text()
    ledger = a.ledger()
    assert ledger.step(b.slice_id, "publish") is None
    assert not any(ledger.step(s, "acknowledge") for s in (a.slice_id, b.slice_id))
    assert not table_exists(spark, settings.table("gold_events_per_hour")), "gold was written"
    spark.sql(
        f"DELETE FROM delta.`{silver_path}` WHERE kafka_offset = {POSITION_OF_A_BAD_COPY}"
    ).collect()
    a.retry_until_done("gate")
    for sl in (b, a):
        row.struck += STRIKES[rng.choice(list(STRIKES))](sl, "publish", rng)
    return a, b


def any_strike(sl: Slice, step: str, rng: random.Random) -> int:
    """The step under a random kind of chaos (the mixed scenario's strike)."""
    return STRIKES[rng.choice(list(STRIKES))](sl, step, rng)


REFUNDS = 5  # events of a type the strict pipelines' expectation refuses


def refunds_definition(path: Path, topic: str, strict: dict[str, bool]) -> None:
    """A definition file with the events pipeline under each name of `strict`, on `topic`;
    a strict one expects every event type to be one the source sends (refunds fail)."""
    events = yaml.safe_load((REPO_ROOT / "pipelines.yaml").read_text())["pipelines"]["events"]
    expect = {"expect_column_values_to_be_in_set": {"column": "event_type", "value_set": TYPES}}
    pipelines = {
        name: {**events, "topic": topic, **({"expectations": [expect]} if on else {})}
        for name, on in strict.items()
    }
    path.write_text(yaml.safe_dump({"pipelines": pipelines}, sort_keys=False))


def produce_with_refunds(settings: Settings, start: datetime, hours: int, seed: int) -> Manifest:
    """`hours` hours of the faulty stream from `start`, the first with REFUNDS refunds sent
    after its other records and before the next hour's, so its slice holds them."""
    manifest = Manifest(settings.topic)
    for k in range(hours):
        part = produce(
            settings, start + timedelta(hours=k), intervals=1, events=300, faults=FAULTS,
            seed=seed + k, id_prefix=f"h{k}-",
        )  # fmt: skip
        manifest.committed_valid |= part.committed_valid
        manifest.malformed |= part.malformed
        if k == 0:
            at = [start + timedelta(minutes=30 + i) for i in range(REFUNDS)]
            refunds = [
                Record(event_value(f"refund-{i}", t, event_type="refund"), i % 3, t)
                for i, t in enumerate(at)
            ]
            conf = {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka_props}
            TxProducer(conf, settings.topic, f"refunds-{uuid.uuid4().hex}").send(refunds)
            manifest.committed_valid |= {f"refund-{i}" for i in range(REFUNDS)}
    return manifest


def last_log(sl: Slice, step: str) -> str:
    return sorted(sl.logs.glob(f"*-{step}.log"))[-1].read_text()


def retried_merge(
    spark,
    settings: Settings,
    broker: LocalBroker,
    server: SparkConnectServer,
    start: datetime,
    logs: Path,
    env: dict[str, str],
    rng: random.Random,
    row: Row,
) -> tuple[Slice, Slice]:
    """A retried ingest under chaos (issue 66, finding 1). A's hour holds refunds its
    pipeline's expectation refuses. A's ingest is killed between its MERGE and its record
    (`silver.merged`); B, the next hour, is ingested and passes its gate; A's ingest runs
    again (its MERGE already committed). B's publication runs beside A's gate, which
    fails: B's must be refused, and gold and the consumer group hold nothing. On-call
    then corrects the expectation (refunds are events too), A's gate passes and both
    publish. Every other step is struck, a random kind each."""
    a, b = (
        Slice(settings, broker, server, start + timedelta(hours=h), logs / name)
        for h, name in ((0, "a"), (1, "b"))
    )
    for sl in (a, b):
        sl.logs.mkdir()
        sl.env.update(env)
    for sl in (a, b):
        row.struck += any_strike(sl, "plan", rng)
    merged = {"SLICEWISE_FAULTS": "silver.merged", "SLICEWISE_FAULT_ACTION": "kill"}
    assert a.launch("ingest", merged).wait(timeout=900) == KILLED, last_log(a, "ingest")
    row.struck += 1
    for step in ("ingest", "gate"):
        row.struck += any_strike(b, step, rng)
    row.struck += any_strike(a, "ingest", rng)  # the retry: its MERGE is in silver
    publishing = b.launch("publish")
    assert a.launch("gate").wait(timeout=900) == 1, "the gate passed the refunds"
    assert "expect_column_values_to_be_in_set" in last_log(a, "gate")
    assert publishing.wait(timeout=900) == 1, "B published past A's failed gate"
    assert f"{a.slice_id} failed the gate" in last_log(b, "publish")
    ledger = a.ledger()
    assert ledger.step(b.slice_id, "publish") is None
    assert not any(ledger.step(s, "acknowledge") for s in (a.slice_id, b.slice_id))
    assert not table_exists(spark, settings.table("gold_events_per_hour")), "gold was written"
    refunds_definition(Path(env["SLICEWISE_PIPELINES_FILE"]), settings.topic, {"events": False})
    a.retry_until_done("gate")
    for sl in (b, a):
        row.struck += any_strike(sl, "publish", rng)
    return a, b


def shared_topic(
    spark,
    broker: LocalBroker,
    server: SparkConnectServer,
    start: datetime,
    logs: Path,
    env: dict[str, str],
    rng: random.Random,
    row: Row,
) -> Slice:
    """Two pipelines on one topic under one SLICEWISE_LEDGER_DIR, under chaos (issue 66,
    finding 2): `loose` has no expectations, `strict` refuses the hour's refunds. Both
    plan and ingest, then each gate runs (strict's fails, loose's passes), each a random
    strike a step; strict's publication is refused and loose's publishes. Each ledger is
    its own, and strict's gold and consumer group hold nothing. Returns loose's slice,
    for the oracle."""
    made = {}
    for name in ("loose", "strict"):
        settings = load_settings({**os.environ, **env, "SLICEWISE_PIPELINE": name})
        sl = Slice(settings, broker, server, start, logs / name)
        sl.logs.mkdir()
        sl.env.update({**env, "SLICEWISE_PIPELINE": name})
        made[name] = sl
    loose, strict = made["loose"], made["strict"]
    for step in ("plan", "ingest"):
        for sl in (loose, strict):
            row.struck += any_strike(sl, step, rng)
    assert strict.launch("gate").wait(timeout=900) == 1, "strict's gate passed the refunds"
    row.struck += any_strike(loose, "gate", rng)
    assert strict.launch("publish").wait(timeout=900) == 1, "strict published its refunds"
    assert "the gate has not passed" in last_log(strict, "publish")
    row.struck += any_strike(loose, "publish", rng)
    assert loose.settings.ledger_dir != strict.settings.ledger_dir
    ledger = strict.ledger()
    assert ledger.step(strict.slice_id, "gate")["success"] is False
    assert loose.ledger().step(loose.slice_id, "gate")["success"]
    assert ledger.step(strict.slice_id, "publish") is None
    assert ledger.step(strict.slice_id, "acknowledge") is None
    assert not table_exists(spark, strict.settings.table("gold_events_per_hour"))
    return loose


def racing_copy(spark, sl: Slice, rng: random.Random, row: Row) -> None:
    """Silver's MERGE against a racer. The first `ingest` stops just before its MERGE
    (`silver.merging`, the `wait` action); then another writer stores a copy of one of
    the slice's keys, as a slice holding another copy would: a copy the slice's beats (a higher position, most runs) must be
    replaced, a better one (the key's first record in its partition) must stay. The
    ingest goes on, its retries and the other steps run clean, and silver must hold
    exactly the winner of the two."""
    from slicewise.silver import parsed_slice
    from slicewise.transforms import survivors, valid_events

    sl.retry_until_done("plan")
    marker = sl.settings.state_dir / "faults" / f"silver.merging-{sl.slice_id}"
    first = sl.launch(
        "ingest", {"SLICEWISE_FAULTS": "silver.merging", "SLICEWISE_FAULT_ACTION": "wait"}
    )
    while not marker.exists() and first.poll() is None:
        time.sleep(0.2)
    assert marker.exists(), "the ingest ended without reaching its MERGE"
    pipeline, silver_path = sl.settings.pipeline, sl.settings.table("silver")
    parsed = parsed_slice(spark, sl.settings, sl.slice_id)
    ours = (
        survivors(valid_events(parsed, pipeline), pipeline)
        .where(F.col("kafka_offset") > 0)
        .orderBy("event_id")
        .first()
    )
    parsed.unpersist()
    beaten = rng.random() < 0.75
    position = (ours.kafka_partition, POSITION_OF_A_BAD_COPY if beaten else 0)
    columns = spark.read.format("delta").load(silver_path).schema
    racer = {**ours.asDict(), "kafka_offset": position[1], "slice_id": "racer"}
    copy = spark.createDataFrame([tuple(racer[c.name] for c in columns)], columns)
    copy.write.format("delta").mode("append").save(silver_path)
    marker.with_name(marker.name + ".resume").touch()
    if first.wait(timeout=900) == 0:
        sl.done("ingest")
    else:
        sl.retry_until_done("ingest")
    for step in ("gate", "publish"):
        sl.retry_until_done(step)
    stored = spark.read.format("delta").load(silver_path).where(F.col("event_id") == ours.event_id)
    winner = (ours.kafka_partition, ours.kafka_offset) if beaten else position
    assert [(r.kafka_partition, r.kafka_offset) for r in stored.collect()] == [winner]
    row.struck += 1


def compare_with_oracle(spark, sl: Slice, manifest: Manifest, row: Row) -> None:
    table = sl.settings.table
    silver = [r.event_id for r in spark.read.format("delta").load(table("silver")).collect()]
    quarantine = [
        (r.partition, r.offset)
        for r in spark.read.format("delta").load(table("quarantine")).collect()
    ]
    gold = spark.read.format("delta").load(table("gold_events_per_hour"))
    row.events += len(manifest.committed_valid)
    row.lost += len(manifest.committed_valid - set(silver))
    row.duplicated += len(silver) - len(set(silver))
    row.unexpected += len(set(silver) - manifest.committed_valid)
    row.quarantined += len(quarantine)
    row.quarantine_wrong += len(set(quarantine) ^ manifest.malformed) + (
        len(quarantine) - len(set(quarantine))
    )
    assert sl.ledger().step(sl.slice_id, "gate")["success"], "the counts did not reconcile"
    assert gold.agg(F.sum("events")).first()[0] == len(silver), "gold does not count silver"


# Mean seconds a run of each scenario took (chaos/chaos_runs.jsonl, the 75 runs of
# 2026-12-03 on b5a7662, 2 cores; scheduler-away: its first run, 2026-12-08): the runs go longest first, so that the two workers,
# each taking the next run as it frees up, end together instead of one waiting on the
# last long scenario alone.
MEAN_SECONDS = {
    FAILED_GATE: 265, "maintenance": 184, WORKER_KILLED: 156, SHARED_TOPIC: 130,
    RETRIED_MERGE: 105, "mid-step": 78, "zombie": 75, "client-killed": 67, "boundary": 59,
    "broker-restart": 54, MIXED: 52, RACING_COPY: 42, "two-clients": 40, "orphan": 38,
    "server-restart": 26, SCHEDULER_AWAY: 1375,
}  # fmt: skip
assert set(MEAN_SECONDS) == set(SCENARIOS)


def chosen_runs() -> list:
    """One test item per run, (scenario, run index), longest scenarios first. The
    worker-killed runs share one Airflow stack (`celery_stack`, module-scoped), so they
    stay on one worker (an xdist group; `make chaos` runs `--dist loadgroup`)."""
    scenarios = sorted(chosen_scenarios(), key=lambda name: -MEAN_SECONDS[name])
    return [
        pytest.param(
            name,
            run,
            id=f"{name}-{run}",
            marks=[pytest.mark.xdist_group("celery")] if name == WORKER_KILLED else [],
        )  # fmt: skip
        for name in scenarios
        for run in range(RUNS)
    ]


@pytest.mark.parametrize(("scenario", "run"), chosen_runs())
def test_chaos_loses_and_duplicates_nothing(
    spark, local_s3, tmp_path, capsys, request, scenario, run
):
    assert STORE in ("local", "s3"), f"SLICEWISE_CHAOS_STORE={STORE!r}: use local or s3"
    row = next((r for r in TABLE if r.scenario == scenario), None)
    if row is None:
        TABLE.append(row := Row(scenario))
    lakehouse = None  # each run's own folder
    if STORE == "s3":
        lakehouse = f"s3a://{local_s3.create_bucket(f'chaos-{uuid.uuid4().hex[:8]}')}"
    if scenario == WORKER_KILLED:  # its own services, started only for it
        stack = request.getfixturevalue("celery_stack")

        def one_run(run: int, seed: int, this: Row) -> None:
            worker_killed_run(spark, stack, run, seed, this)
    elif scenario == SCHEDULER_AWAY:  # its own Airflow per run, on the chaos broker and server
        broker, server = (request.getfixturevalue(f) for f in ("chaos_broker", "chaos_server"))
        new_database = request.getfixturevalue("postgres_server")

        def one_run(run: int, seed: int, this: Row) -> None:
            scheduler_away_run(
                spark, broker, server, new_database, tmp_path / f"run-{run}", seed, this
            )
    else:
        broker, server = (request.getfixturevalue(f) for f in ("chaos_broker", "chaos_server"))

        def one_run(run: int, seed: int, this: Row) -> None:
            state = tmp_path / f"run-{run}"
            where = f"{lakehouse}/run-{run}" if lakehouse else str(state / "lakehouse")
            strike_run(spark, broker, server, state, where, scenario, seed, this)

    try:
        strike_one(scenario, run, row, one_run, tmp_path)
    finally:
        with capsys.disabled():
            print(render(TABLE))


def strike_one(
    scenario: str, run: int, row: Row, one_run: Callable[[int, int, Row], None], tmp_path: Path
) -> None:
    """One run, recorded (SLICEWISE_CHAOS_RECORD) whatever its outcome; its seed is
    SLICEWISE_CHAOS_SEED + run when that is set (to replay a failed run), else drawn."""
    given = os.environ.get("SLICEWISE_CHAOS_SEED")
    seed = int(given) + run if given else random.randrange(2**32)
    record = os.environ.get("SLICEWISE_CHAOS_RECORD")
    state = tmp_path / f"run-{run}"
    this = Row(scenario, runs=1)
    began, error = time.monotonic(), None
    try:
        one_run(run, seed, this)
    except Exception as exc:  # recorded as a failed run, then raised
        this.failed, error = 1, f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        row.add(this)
        if record:
            append(Path(record), this, seed, time.monotonic() - began, error, STORE)
    assert this.clean, f"run {run} (seed {seed}, logs in {state / 'logs'}): {this}"


def strike_run(
    spark,
    chaos_broker: LocalBroker,
    chaos_server: SparkConnectServer,
    state: Path,
    lakehouse: str,
    scenario: str,
    seed: int,
    row: Row,
) -> None:
    """One randomized run: a faulty stream, its slice under chaos, the oracle's verdict."""
    rng = random.Random(seed)
    env = {
        "SLICEWISE_KAFKA_BOOTSTRAP": chaos_broker.bootstrap,
        "SLICEWISE_SPARK_REMOTE": chaos_server.url,
        TOKEN_ENV: chaos_server.token,  # authentication on, as in production
        "SLICEWISE_TOPIC": f"chaos-{uuid.uuid4().hex[:8]}",
        "SLICEWISE_STATE_DIR": str(state),
        "SLICEWISE_LAKEHOUSE": lakehouse,
    }
    ago, hours = timedelta(hours=3), 1
    if scenario == "maintenance":
        env.update(maintained_backfill(state))
        ago, hours = timedelta(days=2), 2
    if scenario in (FAILED_GATE, RETRIED_MERGE):
        ago, hours = timedelta(hours=4), 2
    refunds = scenario in (RETRIED_MERGE, SHARED_TOPIC)
    if refunds:  # the topic named in the definition (two pipelines read it in one)
        state.mkdir(parents=True, exist_ok=True)
        env["SLICEWISE_PIPELINES_FILE"] = str(state / "pipelines.yaml")
        strict = {"loose": False, "strict": True} if scenario == SHARED_TOPIC else {"events": True}
        refunds_definition(state / "pipelines.yaml", env.pop("SLICEWISE_TOPIC"), strict)
    if scenario == SHARED_TOPIC:
        env["SLICEWISE_LEDGER_DIR"] = str(state / "ledgers")
    settings = load_settings({**os.environ, **env})
    start = (datetime.now(timezone.utc) - ago).replace(minute=0, second=0, microsecond=0)
    if refunds:
        manifest = produce_with_refunds(settings, start, hours, seed)
    else:
        manifest = produce(
            settings, start, intervals=hours, events=300 * hours, faults=FAULTS, seed=seed
        )
    logs = state / "logs"
    logs.mkdir(parents=True)
    if scenario in (FAILED_GATE, RETRIED_MERGE):
        held = held_back if scenario == FAILED_GATE else retried_merge
        a, b = held(spark, settings, chaos_broker, chaos_server, start, logs, env, rng, row)
        assert a.ledger().step(a.slice_id, "gate")["success"]
        compare_with_oracle(spark, b, manifest, row)  # silver, quarantine and gold: both hours
        return
    if scenario == SHARED_TOPIC:
        loose = shared_topic(spark, chaos_broker, chaos_server, start, logs, env, rng, row)
        compare_with_oracle(spark, loose, manifest, row)
        return
    if hours == 2:
        # The hour before, unstruck, then maintenance: silver's date holds that hour's
        # files when the struck slice MERGEs into it beside the next maintenance runs,
        # and the files this run compacts away are past the retention by the gate's.
        earlier = Slice(settings, chaos_broker, chaos_server, start, logs / "earlier")
        earlier.logs.mkdir()
        earlier.env.update(env)
        for step in (*STEPS, "maintain"):
            earlier.retry_until_done(step)
        start += timedelta(hours=1)
    sl = Slice(settings, chaos_broker, chaos_server, start, logs)
    sl.env.update(env)
    if scenario == RACING_COPY:
        racing_copy(spark, sl, rng, row)
    else:
        row.struck += strike(scenario, sl, rng)
    compare_with_oracle(spark, sl, manifest, row)


# -- worker-killed: the DAG itself, its tasks on a Celery worker of another host ---------


@dataclass
class CeleryStack:
    """Airflow (CeleryExecutor) with its worker on another host, and what the worker
    reaches over its link: the broker, the Spark Connect server, Redis."""

    hosts: Hosts
    worker_ns: str
    settings: Settings
    airflow: AirflowServices


@pytest.fixture(scope="module")
def celery_stack(tmp_path_factory, postgres_server) -> Iterator[CeleryStack]:
    state = tmp_path_factory.mktemp("chaos-celery")
    (port,) = free_ports(1)
    with Hosts() as hosts:
        worker_ns, _ = hosts.add("airflow")
        with (
            running_broker(state / "kafka", host=hosts.gateway) as broker,
            LocalRedis(state / "redis", host=hosts.gateway) as redis,
            SparkConnectServer(state / "spark", port, "local[2]", bind=hosts.gateway) as server,
        ):
            env = {
                "SLICEWISE_KAFKA_BOOTSTRAP": broker.bootstrap,
                "SLICEWISE_SPARK_REMOTE": server.url,
                TOKEN_ENV: server.token,
                "SLICEWISE_TOPIC": f"chaos-celery-{uuid.uuid4().hex[:8]}",
                "SLICEWISE_STATE_DIR": str(state),
                "SLICEWISE_LAKEHOUSE": str(state / "lakehouse"),
                "SLICEWISE_GRACE_SECONDS": "0",
                "SLICEWISE_RECORDS_PER_TASK": "40",
            }
            environ = {**os.environ, **env}
            settings = load_settings(environ)
            deployment = {
                **airflow_env(settings, environ),
                "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_connection(server.url, server.token),
                "AIRFLOW_HOME": str(state / "airflow"),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_server(
                    f"chaos_{uuid.uuid4().hex[:12]}"
                ),
                # A lost worker's task is failed (then retried) this soon, not after 5 min.
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            }
            worker = Celery(redis.url(), worker_ns=worker_ns)
            with AirflowServices(
                deployment, state / "airflow-logs", triggerer=True, host=hosts.gateway,
                celery=worker,
            ) as airflow:  # fmt: skip
                yield CeleryStack(hosts, worker_ns, settings, airflow)


def ingest_instance(stack: CeleryStack, hour: datetime) -> tuple[str, int] | None:
    """(state, try number) of the hour's `ingest` task instance, once it exists."""
    with stack.airflow.db.connect() as conn:
        found = conn.execute(
            text(
                "SELECT ti.state, ti.try_number FROM task_instance ti JOIN dag_run r"
                " ON r.dag_id = ti.dag_id AND r.run_id = ti.run_id"
                " WHERE ti.task_id = 'ingest' AND r.logical_date = :at"
            ),
            {"at": hour},
        ).first()
    return None if found is None else (str(found[0]), int(found[1]))


def worker_killed_run(spark, stack: CeleryStack, run: int, seed: int, row: Row) -> None:
    """One hour through the DAG (a backfill); while its `ingest` runs on the Celery worker,
    every process of the worker's host is killed (SIGKILL), and a new worker starts there.
    Airflow fails the lost attempt once its heartbeat stops and retries it on the new
    worker; the run must end in success with silver exact against the oracle."""
    rng = random.Random(seed)
    settings = stack.settings
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    # An hour of its own for each run of the module, later than the earlier runs' hours:
    # the slices before froze their ends at the topic's end, so records written now for
    # an earlier hour would lie past them (late, for a later slice).
    hour = now - timedelta(hours=RUNS + 2 - run)
    manifest = produce(
        settings, hour, intervals=1, events=300, faults=FAULTS, seed=seed, id_prefix=f"r{seed}-"
    )
    stack.airflow.backfill(hour, hour + timedelta(hours=1), wait=False)
    deadline = time.monotonic() + 600
    while (ingest_instance(stack, hour) or ("",))[0] != "running":
        assert time.monotonic() < deadline, f"ingest never ran: {stack.airflow.tail()}"
        time.sleep(0.5)
    time.sleep(rng.uniform(1, STEP_SECONDS["ingest"] * 0.75))
    mid_ingest = ingest_instance(stack, hour)[0] == "running"
    assert stack.hosts.kill(stack.worker_ns), "no process on the worker's host"
    row.struck += mid_ingest
    stack.airflow.restart_worker()
    [done] = stack.airflow.wait_for_backfill(hour, hour + timedelta(hours=1)).values()
    assert done.state == "success", stack.airflow.tail()
    if mid_ingest:  # the lost attempt was failed and retried, not left running
        assert ingest_instance(stack, hour) == ("success", 2)
    [sl] = [s for s in Ledger.of(settings).slices() if s.start == hour]
    table = settings.table
    slice_ids = spark.read.format("delta").load(table("slice_ids"))
    kept = {r.event_id for r in slice_ids.where(F.col("slice_id") == sl.slice_id).collect()}
    silver = spark.read.format("delta").load(table("silver"))
    ours = [
        r.event_id
        for r in silver.where(F.col("event_id").startswith(f"r{seed}-"))
        .select("event_id")
        .collect()
    ]
    quarantine = {
        (r.partition, r.offset)
        for r in spark.read.format("delta")
        .load(table("quarantine"))
        .where(F.col("slice_id") == sl.slice_id)
        .collect()
    }
    row.events += len(manifest.committed_valid)
    row.lost += len(manifest.committed_valid - set(ours))
    row.duplicated += len(ours) - len(set(ours))
    row.unexpected += len((set(ours) | kept) - manifest.committed_valid)
    row.quarantined += len(quarantine)
    row.quarantine_wrong += len(quarantine ^ manifest.malformed)
    assert Ledger.of(settings).step(sl.slice_id, "gate")["success"]
    gold = spark.read.format("delta").load(table("gold_events_per_hour"))
    assert gold.agg(F.sum("events")).first()[0] == silver.count(), "gold does not count silver"


# -- scheduler-away: the DAG on a one-minute schedule, its scheduler away --------------


class Stream:
    """Committed events produced at a steady pace, each with its time as timestamp."""

    def __init__(self, settings: Settings, prefix: str) -> None:
        self.settings, self.prefix = settings, prefix
        self.sent: list[tuple[str, datetime]] = []
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._conf = {"bootstrap.servers": settings.bootstrap_servers}
        ensure_topic(self._conf, settings.topic, partitions=3)

    def _run(self) -> None:
        producer = TxProducer(self._conf, self.settings.topic, f"{self.prefix}stream")
        n = 0
        while not self.stopped.wait(2.0):
            now = datetime.now(timezone.utc)
            batch = [(f"{self.prefix}{n + i}", now) for i in range(3)]
            producer.send(
                [Record(event_value(e, at), i % 3, at) for i, (e, at) in enumerate(batch)]
            )
            self.sent += batch
            n += 3

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self._thread.join(timeout=60)


def scheduler_away_run(
    spark, broker: LocalBroker, server: SparkConnectServer, new_database, state: Path, seed: int,
    row: Row,
) -> None:  # fmt: skip
    """The DAG on a one-minute schedule with catchup off, its scheduler killed (kill -9)
    or the DAG paused for three to four intervals, then back. Airflow runs the latest
    interval only: its publication must be refused, naming the intervals no slice owns;
    on-call backfills what `slicewise status` lists, the refused publication's retry then
    passes, and silver holds every event up to the newest published slice exactly once,
    with the consumer group at its end and no range unowned."""
    rng = random.Random(seed)
    env = {
        "SLICEWISE_KAFKA_BOOTSTRAP": broker.bootstrap,
        "SLICEWISE_SPARK_REMOTE": server.url,
        TOKEN_ENV: server.token,
        "SLICEWISE_TOPIC": f"chaos-away-{uuid.uuid4().hex[:8]}",
        "SLICEWISE_STATE_DIR": str(state),
        "SLICEWISE_LAKEHOUSE": str(state / "lakehouse"),
        "SLICEWISE_SCHEDULE": "1m",
        "SLICEWISE_GRACE_SECONDS": "5",
        "SLICEWISE_PUBLISH_WAIT_SECONDS": "20",
    }
    environ = {**os.environ, **env}
    settings = load_settings(environ)
    deployment = {
        **airflow_env(settings, environ=environ),
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_connection(server.url, server.token),
        "AIRFLOW_HOME": str(state / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": new_database(f"away_{uuid.uuid4().hex[:12]}"),
    }
    prefix = f"r{seed}-"
    paused = rng.random() < 0.5
    away = rng.uniform(3.2, 4.2) * 60
    with (
        Stream(settings, prefix) as stream,
        AirflowServices(
            deployment, state / "airflow-logs", triggerer=True, scheduled=True,
        ) as airflow,
    ):  # fmt: skip
        airflow.wait_for_scheduled_success(timeout=600)
        if paused:
            airflow_cli(deployment, "dags", "pause", DAG_ID)
        else:
            airflow.kill("scheduler")
        time.sleep(away)
        if paused:
            airflow_cli(deployment, "dags", "unpause", DAG_ID)
        else:
            airflow.restart(["scheduler"])
        row.struck += 1
        time.sleep(90)  # the latest interval runs meanwhile
        stream.__exit__()
        last_sent = max(at for _, at in stream.sent)
        # On-call: what `status` names, backfilled; until the newest published slice ends
        # past the last record and nothing is unowned.
        deadline = time.monotonic() + 1200
        backfilled: set[tuple[str, str]] = set()
        while True:
            report = status_json(deployment)
            for start, end in report["unowned"]:
                if (start, end) not in backfilled:
                    with contextlib.suppress(RuntimeError):  # one backfill still open: later
                        # As the refusal says: several runs at once (one at a time, a
                        # slice committed after the range waits for the whole of it).
                        airflow.backfill(
                            datetime.fromisoformat(start), datetime.fromisoformat(end),
                            wait=False, interval=timedelta(minutes=1), max_active_runs=4,
                        )  # fmt: skip
                        backfilled.add((start, end))
            if backfilled:  # a refused publication whose retries ran out: cleared
                airflow_cli(deployment, "tasks", "clear", DAG_ID, "--only-failed", "--yes")
            acked = Ledger.of(settings).mark("acknowledged")
            if acked and datetime.fromisoformat(acked["through"]) > last_sent:
                if not report["unowned"]:
                    break
            assert time.monotonic() < deadline, f"not caught up: {report}\n{airflow.tail()}"
            time.sleep(10)
        assert backfilled, "the skipped intervals were never named"
    through = datetime.fromisoformat(Ledger.of(settings).mark("acknowledged")["through"])
    expected = {e for e, at in stream.sent if at < through}
    silver = [
        r.event_id
        for r in spark.read.format("delta").load(settings.table("silver"))
        .where(F.col("event_id").startswith(prefix)).select("event_id").collect()
    ]  # fmt: skip
    row.events += len(expected)
    row.lost += len(expected - set(silver))
    row.duplicated += len(silver) - len(set(silver))
    row.unexpected += len(set(silver) - {e for e, _ in stream.sent})


def airflow_cli(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [str(VENV_BIN / "airflow"), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr


def status_json(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [str(VENV_BIN / "slicewise"), "status", "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
