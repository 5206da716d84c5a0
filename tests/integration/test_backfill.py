"""`airflow backfill create`, run by a real scheduler (LocalExecutor), triggerer and
api-server on the test's SQLite metadata DB, against the real broker, Spark and Delta."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from test_airflow_e2e import asset_events  # same folder, on sys.path under pytest

from slicewise.airflow_env import VENV_BIN, airflow_env
from slicewise.kafka.broker import free_ports
from slicewise.kafka.producer import Record, event_value

pytestmark = pytest.mark.integration

DAG_ID = "slicewise_pipeline"


def airflow(env: dict[str, str], *args: str) -> str:
    """Run an Airflow CLI command; again if SQLite was locked by a busy scheduler."""
    for attempt in range(5):
        out = subprocess.run(
            [str(VENV_BIN / "airflow"), *args], env=env, capture_output=True, text=True, timeout=300
        )
        if out.returncode == 0 or "database is locked" not in out.stderr:
            break
        time.sleep(5 * (attempt + 1))
    assert out.returncode == 0, f"airflow {' '.join(args)} failed:\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture
def scheduler_env(pipeline, airflow_db, tmp_path: Path) -> Iterator[tuple]:
    """api-server + scheduler + triggerer sharing the test's metadata DB; stopped after."""
    settings, producer = pipeline
    (port,) = free_ports(1)
    env = {
        **airflow_env(settings, spark_master="local[2]"),
        "AIRFLOW_HOME": os.environ["AIRFLOW_HOME"],
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        # Only the backfills run: no scheduled run for the latest interval on unpause.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "SLICEWISE_GRACE_SECONDS": "0",
    }
    airflow(env, "dags", "reserialize")
    airflow(env, "dags", "unpause", DAG_ID)
    logs = tmp_path / "airflow-logs"
    logs.mkdir()
    procs = []
    for component in (["api-server", "--port", str(port)], ["scheduler"], ["triggerer"]):
        out = open(logs / f"{component[0]}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(
            (
                subprocess.Popen(
                    [str(VENV_BIN / "airflow"), *component],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                ),
                out,
            )
        )
    deadline = time.monotonic() + 120
    while not port_open(port):
        assert time.monotonic() < deadline, (logs / "api-server.log").read_text()[-3000:]
        time.sleep(1)
    try:
        yield settings, producer, env, logs
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, out in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            out.close()


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def backfill_runs() -> tuple[dict[datetime, str], bool]:
    """State of every backfill run, by data interval start; and whether a backfill is still open.

    The scheduler closes a backfill a few loops after its last run ends, and Airflow refuses a
    second backfill of the same DAG until then.
    """
    from airflow.models.backfill import Backfill
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(DagRun.data_interval_start, DagRun.state).where(
                DagRun.dag_id == DAG_ID, DagRun.run_type == DagRunType.BACKFILL_JOB
            )
        ).all()
        open_backfill = session.scalar(
            select(Backfill.id).where(Backfill.dag_id == DAG_ID, Backfill.completed_at.is_(None))
        )
    return {start.astimezone(UTC): str(state) for start, state in rows}, open_backfill is not None


def backfill(env, logs: Path, start: datetime, end: datetime, reprocess: str) -> dict:
    """Backfill the hourly intervals in [start, end); wait until the backfill has completed.

    The CLI's dates are logical dates (interval starts), both ends included.
    """
    airflow(
        env,
        "backfill",
        "create",
        "--dag-id",
        DAG_ID,
        "--from-date",
        start.isoformat(),
        "--to-date",
        (end - timedelta(hours=1)).isoformat(),
        "--reprocess-behavior",
        reprocess,
        "--max-active-runs",
        "1",
    )
    hours = int((end - start) / timedelta(hours=1))
    wanted = [start + timedelta(hours=h) for h in range(hours)]
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        all_runs, still_open = backfill_runs()
        runs = {at: state for at, state in all_runs.items() if start <= at < end}
        # A reprocessed run is cleared back to queued before it runs again.
        done = sorted(runs) == wanted and all(s in ("success", "failed") for s in runs.values())
        if done and not still_open:
            return runs
        time.sleep(3)
    tails = {p.name: p.read_text()[-2000:] for p in logs.iterdir()}
    raise AssertionError(f"backfill did not finish: {backfill_runs()}\n{tails}")


def rows_of(spark, settings, table: str, slice_id: str) -> list[tuple]:
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(settings.table(table))
    return sorted(map(tuple, df.where(F.col("slice_id") == slice_id).collect()), key=repr)


def test_backfill_over_processed_intervals_with_reprocess_completed_changes_nothing(
    spark, scheduler_env
):
    from slicewise.ledger import Ledger

    settings, producer, env, logs = scheduler_env
    start = (datetime.now(UTC) - timedelta(hours=4)).replace(minute=0, second=0, microsecond=0)
    for h in range(2):
        ts = start + timedelta(hours=h, minutes=20)
        producer.send(
            [Record(event_value(f"h{h}-{i}", ts), i % 3, ts) for i in range(10)]
            + [Record(event_value("h0-1", ts), 1, ts)]  # a duplicate, in both hours
        )

    first = backfill(env, logs, start, start + timedelta(hours=1), reprocess="none")
    assert list(first.values()) == ["success"], first
    ledger = Ledger(settings.ledger_dir, settings.topic)
    [slice_1] = [sl.slice_id for sl in ledger.slices()]
    before = {t: rows_of(spark, settings, t, slice_1) for t in ("bronze", "silver")}
    assert len(before["bronze"]) == 11 and len(before["silver"]) == 10

    # The UI's "reprocess completed runs": the done interval runs again, the new one for the first time.
    both = backfill(env, logs, start, start + timedelta(hours=2), reprocess="completed")
    assert set(both.values()) == {"success"}, both
    assert {t: rows_of(spark, settings, t, slice_1) for t in ("bronze", "silver")} == before
    slice_ids = sorted(sl.slice_id for sl in ledger.slices())
    assert len(slice_ids) == 2
    silver = spark.read.format("delta").load(settings.table("silver"))
    assert sorted(r.event_id for r in silver.collect()) == sorted(
        f"h{h}-{i}" for h in range(2) for i in range(10)
    )
    assert all(len(asset_events(settings, s)) == 1 for s in slice_ids)  # announced once per slice
