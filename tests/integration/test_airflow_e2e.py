"""The real DAG through Airflow (dag.test, SQLite metadata DB) against the real broker,
Delta and Great Expectations: its Spark steps as clients of the shared Spark Connect
server (the default mode), and once as spark-submit applications; and the OpenLineage
events of a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from slicewise.connect_auth import TOKEN_ENV
from slicewise.ledger import Ledger
from slicewise_dev.airflow_env import airflow_env
from slicewise_dev.producer import Record, event_value

pytestmark = pytest.mark.integration

PASSED_ON = (
    "AIRFLOW_CONN_SPARK_DEFAULT",
    "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
    "SLICEWISE_SPARK_REMOTE",
    "PATH",
    "SLICEWISE_STATE_DIR",
    "SLICEWISE_LAKEHOUSE",
    "SLICEWISE_TOPIC",
    "SLICEWISE_KAFKA_BOOTSTRAP",
    "SLICEWISE_CACHE_DIR",
)


def load_dag(pipeline, monkeypatch, mode: str):
    settings, producer = pipeline
    env = airflow_env(settings, spark_master="local[2]")
    for key in PASSED_ON:
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("SLICEWISE_GRACE_SECONDS", "0")
    monkeypatch.setenv("SLICEWISE_SPARK_MODE", mode)
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=env["AIRFLOW__CORE__DAGS_FOLDER"]).get_dag("slicewise_events")
    return settings, producer, dag


@pytest.fixture
def dag_env(pipeline, airflow_db, monkeypatch):
    return load_dag(pipeline, monkeypatch, "connect")


def states(dag_run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


def asset_events(settings, slice_id: str) -> list[dict]:
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        extras = session.scalars(select(AssetEvent.extra)).all()
    return [e for e in extras if (e.get("topic"), e.get("slice_id")) == (settings.topic, slice_id)]


def silver_rows(spark, settings):
    return sorted(map(tuple, spark.read.format("delta").load(settings.table("silver")).collect()))


def tables(spark, settings) -> dict[str, list[tuple]]:
    """Every row of every table the pipeline writes: 'nothing changed' means this is equal."""
    return {
        name: sorted(
            map(tuple, spark.read.format("delta").load(settings.table(name)).collect()), key=repr
        )
        for name in ("bronze", "silver", "quarantine", "gold_events_per_hour")
    }


def produce_hour(producer, start, prefix: str = "e") -> None:
    """20 valid events, a cross-partition duplicate, a malformed record, an aborted one."""
    ts = start + timedelta(minutes=10)
    producer.send(
        [Record(event_value(f"{prefix}{i}", ts), i % 3, ts) for i in range(20)]
        + [Record(event_value(f"{prefix}1", ts), 2, ts), Record(b"not json", 0, ts)]
    )
    producer.send([Record(event_value("aborted", ts), 0, ts)], commit=False)


def retry_at_once_in(dag) -> None:
    """A failed task of `dag` tries again at once, not after the DAG's back-off."""
    for task in dag.tasks:
        task.retry_delay = timedelta(0)
        task.retry_exponential_backoff = False


def end_to_end(spark, settings, producer, run_dag, events_of) -> None:
    """One interval through the whole DAG, a rerun that changes nothing, a gate that blocks.

    `run_dag(logical_date, retry_at_once=False)` runs the DAG and returns each task's
    state (`retry_at_once`: a failed task's retries follow at once, not after the DAG's
    back-off); `events_of(slice_id)` lists the extras of the silver Asset events Airflow
    stored for that slice.
    """
    start = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(
        minute=0, second=0, microsecond=0
    )
    produce_hour(producer, start)
    ledger = Ledger.of(settings)

    states = run_dag(start + timedelta(hours=1))
    assert set(states.values()) == {"success"}, states
    [sl] = ledger.slices()  # the run's data interval, not now(), named the slice
    assert (sl.start, sl.end) == (start, start + timedelta(hours=1))
    ids = sorted(r[0] for r in silver_rows(spark, settings))
    assert ids == sorted(f"e{i}" for i in range(20))
    gate = ledger.step(sl.slice_id, "gate")
    assert gate["success"] and gate["counts"]["read"] == 22 and gate["counts"]["quarantined"] == 1
    [event] = events_of(sl.slice_id)
    assert event["silver_version"] >= 1
    assert event["counts"] == {"read": 22, "quarantined": 1, "inserted": 20}
    before = tables(spark, settings)

    # The same interval again clears every task and runs it again (what on-call does
    # with "clear", and a backfill with reprocessing): same slice, every table row for
    # row the same, no second Asset event.
    again = run_dag(start + timedelta(hours=1))
    assert again["announce"] == "skipped" and again["gate"] == "success", again
    assert tables(spark, settings) == before
    assert len(events_of(sl.slice_id)) == 1
    # ... and the slice keeps its one recorded outcome, the rerun listed beside it.
    rechecked = ledger.step(sl.slice_id, "gate")
    assert {k: rechecked[k] for k in gate} == gate
    assert [r["counts"] for r in rechecked["rechecks"]] == [None]

    # An hour with no record: an empty slice, the run green, nothing announced.
    empty = run_dag(start + timedelta(hours=2))
    assert empty["gate"] == "success" and empty["announce"] == "skipped", empty
    [_, hollow] = ledger.slices()
    assert ledger.step(hollow.slice_id, "gate")["counts"]["read"] == 0
    assert ledger.step(hollow.slice_id, "announce")["skipped"] == "empty slice"
    assert events_of(hollow.slice_id) == []

    # Force a duplicate into silver: the gate must fail, naming it, and nothing is published.
    dup = spark.read.format("delta").load(settings.table("silver")).where(F.col("event_id") == "e3")
    dup.write.format("delta").mode("append").save(settings.table("silver"))
    failed = run_dag(start + timedelta(hours=1), retry_at_once=True)
    assert failed["gate"] == "failed", failed
    assert failed["publish"] == "upstream_failed" and failed["announce"] == "upstream_failed"
    gate = ledger.step(sl.slice_id, "gate")
    assert gate["success"] is False and "e3" in gate["summary"]
    assert len(events_of(sl.slice_id)) == 1


def test_dag_runs_end_to_end_reruns_change_nothing_and_a_failed_gate_blocks_publication(
    spark, dag_env, tmp_path
):
    """The interval's first run goes through `airflow dags test` in a process of its own
    with Airflow's OpenLineage provider on (its file transport, as a deployment configures
    it: the provider's listener starts with the transport set), and its events are
    checked at the end; the reruns are `dag.test()` in this process."""
    settings, producer, dag = dag_env
    lineage = tmp_path / "lineage.jsonl"
    runs = 0

    def run_dag(logical_date: datetime, retry_at_once: bool = False) -> dict[str, str]:
        nonlocal runs
        runs += 1
        if retry_at_once:  # the failing gate's retry: a minute of back-off, waited out idle
            retry_at_once_in(dag)
        if runs > 1:
            return states(dag.test(logical_date=logical_date))
        dags_test_with_lineage(logical_date, lineage)
        return stored_states(dag.dag_id, logical_date)

    end_to_end(
        spark,
        settings,
        producer,
        run_dag=run_dag,
        events_of=lambda slice_id: asset_events(settings, slice_id),
    )
    first = Ledger.of(settings).slices()[0]
    lineage_names_every_table_once_with_the_ledgers_counts(settings, first, lineage)


def test_a_failure_in_every_task_then_its_retry_ends_exactly_right(spark, dag_env, monkeypatch):
    """Each task fails once right after its write committed (the worst moment), then retries."""
    from slicewise.faults import POINTS

    settings, producer, dag = dag_env
    start = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(
        minute=0, second=0, microsecond=0
    )
    produce_hour(producer, start)
    monkeypatch.setenv("SLICEWISE_FAULTS", ",".join(POINTS))
    retry_at_once_in(dag)  # production backs off for minutes; the test retries at once
    dag.get_task("ingest").retries = 4  # its four points need five tries; the default gives four

    run = dag.test(logical_date=start + timedelta(hours=1))
    assert set(states(run).values()) == {"success"}, states(run)
    fired = sorted(p.name.split("-")[0] for p in (settings.state_dir / "faults").iterdir())
    assert fired == sorted(POINTS)
    tries = {ti.task_id: ti.try_number for ti in run.get_task_instances()}
    # ingest passes bronze's fault point and silver's three; quarantine's runs beside the
    # MERGE's (`silver.write_slice`), so two of them may fire in one try: four or five.
    assert tries.pop("ingest") in (4, 5), tries
    assert tries == {
        "wait_for_interval_close": 1,
        "plan": 2,
        "gate": 2,
        "publish": 2,
        "announce": 2,
    }, tries

    slice_id = run.get_task_instance("plan").xcom_pull(task_ids="plan")
    silver = spark.read.format("delta").load(settings.table("silver"))
    assert sorted(r.event_id for r in silver.collect()) == sorted(f"e{i}" for i in range(20))
    bronze = spark.read.format("delta").load(settings.table("bronze"))
    assert bronze.count() == 22 == bronze.select("partition", "offset").distinct().count()
    quarantine = spark.read.format("delta").load(settings.table("quarantine"))
    assert [(r.value, r.reason) for r in quarantine.collect()] == [(b"not json", "invalid_json")]
    gold = spark.read.format("delta").load(settings.table("gold_events_per_hour"))
    assert gold.agg(F.sum("events")).first()[0] == 20
    gate = Ledger.of(settings).step(slice_id, "gate")
    assert gate["success"] and gate["counts"]["missing"] == 0
    # announce failed after recording the ledger: its retry must still announce, once.
    assert len(asset_events(settings, slice_id)) == 1


def test_the_spark_submit_mode_runs_the_dag_end_to_end(spark, pipeline, airflow_db, monkeypatch):
    """SLICEWISE_SPARK_MODE=submit: each Spark step is its own spark-submit application."""
    from slicewise.operators import SliceSparkSubmitOperator

    settings, producer, dag = load_dag(pipeline, monkeypatch, "submit")
    assert isinstance(dag.get_task("ingest"), SliceSparkSubmitOperator)
    start = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(
        minute=0, second=0, microsecond=0
    )
    produce_hour(producer, start)
    run = dag.test(logical_date=start + timedelta(hours=1))
    assert set(states(run).values()) == {"success"}, states(run)
    assert [r[0] for r in silver_rows(spark, settings)] == sorted(f"e{i}" for i in range(20))
    [sl] = Ledger.of(settings).slices()
    gate = Ledger.of(settings).step(sl.slice_id, "gate")
    assert gate["success"] and gate["counts"]["read"] == 22 and gate["counts"]["quarantined"] == 1
    assert len(asset_events(settings, sl.slice_id)) == 1


def test_a_server_down_or_a_wrong_token_fails_the_step_fast_and_its_retry_then_succeeds(
    spark_remote, pipeline, airflow_db, monkeypatch
):
    """The connect mode's failures when its server is down or refuses the connection's
    token: within seconds, naming the connection and the safe action, never the token;
    the same task succeeds once the server answers and the token is right."""
    from slicewise.connect_server import connect_connection
    from slicewise.operators import SliceSparkConnectOperator
    from slicewise.planner import plan_slice
    from slicewise.spark import SparkUnauthorized, SparkUnavailable
    from slicewise_dev.broker import free_ports

    settings, producer, _ = load_dag(pipeline, monkeypatch, "connect")
    start = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(
        minute=0, second=0, microsecond=0
    )
    produce_hour(producer, start)
    sl = plan_slice(settings, start, start + timedelta(hours=1))
    bronze = SliceSparkConnectOperator(
        task_id="bronze",
        step="bronze",
        argv=["--slice-id", sl.slice_id],
        conn_id="spark_connect_default",
    )
    (closed,) = free_ports(1)
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
        connect_connection(f"sc://127.0.0.1:{closed}", os.environ[TOKEN_ENV]),
    )
    began = time.monotonic()
    with pytest.raises(SparkUnavailable) as down:
        bronze.execute({"params": {}})
    assert time.monotonic() - began < 30
    message = str(down.value)
    assert "'spark_connect_default'" in message and f"127.0.0.1:{closed}" in message
    assert "Nothing was written" in message and "RUNBOOK.md#spark-connect-server-down" in message
    assert Ledger.of(settings).step(sl.slice_id, "bronze") is None

    # A wrong token: refused as fast, naming the connection and where the token goes.
    wrong = "not-the-token"
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", connect_connection(spark_remote, wrong)
    )
    with pytest.raises(SparkUnauthorized) as refused:
        bronze.execute({"params": {}})
    message = str(refused.value)
    assert "'spark_connect_default'" in message and "Invalid authentication token" in message
    assert "password" in message and wrong not in message and os.environ[TOKEN_ENV] not in message
    assert Ledger.of(settings).step(sl.slice_id, "bronze") is None

    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
        connect_connection(spark_remote, os.environ[TOKEN_ENV]),
    )
    result = bronze.execute({"params": {}})  # the least context a task has
    assert (result.rows, result.committed) == (22, True)


def dags_test_with_lineage(logical_date: datetime, events: Path) -> None:
    """`airflow dags test` of the DAG in a process of its own (this test's environment),
    Airflow's OpenLineage provider writing its events to `events`."""
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "airflow"),
            "dags",
            "test",
            "slicewise_events",
            logical_date.isoformat(),
        ],
        env={
            **os.environ,
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "slicewise-tests",
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(events), "append": True}
            ),
        },
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def stored_states(dag_id: str, logical_date: datetime) -> dict[str, str]:
    """Each task's state in the DAG's run of `logical_date`, from the metadata DB."""
    from airflow.models import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalars(
            select(DagRun).where(DagRun.dag_id == dag_id, DagRun.logical_date == logical_date)
        ).one()
        return {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}


def lineage_names_every_table_once_with_the_ledgers_counts(settings, sl, events: Path) -> None:
    """The OpenLineage events of the slice's run name every table once, with the
    ledger's counts (the run of `produce_hour`'s records)."""
    complete = {
        e["job"]["name"].split(".")[-1]: e
        for e in map(json.loads, events.read_text().splitlines())
        if e["eventType"] == "COMPLETE" and e["job"]["name"].startswith("slicewise_events.")
    }
    assert {"ingest", "gate", "publish"} <= set(complete), sorted(complete)
    for step in ("ingest", "gate", "publish"):
        facet = complete[step]["run"]["facets"]["slicewise_slice"]
        assert facet["sliceId"] == sl.slice_id
        assert facet["ranges"] == {str(p): list(r) for p, r in sl.ranges.items()}

    def named(dataset) -> str:
        return dataset["name"].rsplit("/", 1)[-1]

    written = [named(d) for e in complete.values() for d in e["outputs"]]
    assert sorted(written) == sorted(
        ["bronze", "silver", "quarantine", "slice_ids", "gold_events_per_hour"]
    )
    ingest = complete["ingest"]
    [topic] = ingest["inputs"]
    assert topic["namespace"] == f"kafka://{settings.bootstrap_servers}"
    assert topic["name"] == settings.topic
    assert topic["inputFacets"]["offsetRanges"]["ranges"] == facet["ranges"]
    [bronze] = [d for d in ingest["outputs"] if named(d) == "bronze"]
    assert bronze["namespace"] == "file" and bronze["name"] == settings.table("bronze")
    assert bronze["outputFacets"]["outputStatistics"]["rowCount"] == 22

    read = {named(d): d for d in complete["gate"]["inputs"]}
    assert read["bronze"]["inputFacets"]["dataQualityMetrics"]["rowCount"] == 22
    assert read["quarantine"]["inputFacets"]["dataQualityMetrics"]["rowCount"] == 1
    assert read["silver"]["inputFacets"]["dataQualityMetrics"]["rowCount"] == 20
    checks = read["silver"]["facets"]["dataQualityAssertions"]["assertions"]
    assert checks and all(c["success"] for c in checks), checks
