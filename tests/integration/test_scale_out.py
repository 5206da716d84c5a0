"""Production-shaped: the same DAG, by configuration alone, run by a real scheduler
(LocalExecutor), triggerer and api-server with the metadata DB on PostgreSQL, its Spark
steps clients of a Spark Connect server that drives a real standalone cluster, and
backfills created with `airflow backfill create` (what the UI's backfill form does)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from sqlalchemy import create_engine, text
from test_airflow_e2e import produce_hour  # same folder, on sys.path under pytest

from slicewise.connect_server import SparkConnectServer, connect_connection
from slicewise.ledger import Ledger
from slicewise.spark import classic_env
from slicewise_dev.airflow_env import VENV_BIN, airflow_env
from slicewise_dev.broker import free_ports

pytestmark = pytest.mark.integration

DAG_ID = "slicewise_pipeline"


def airflow(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        [str(VENV_BIN / "airflow"), *args], env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, f"airflow {' '.join(args)} failed:\n{out.stderr[-3000:]}"
    return out.stdout


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Deployment:
    """Airflow's components as separate processes sharing one PostgreSQL metadata DB."""

    def __init__(self, env: dict[str, str], logs: Path, db_url: str) -> None:
        self.env, self.logs, self.db = env, logs, create_engine(db_url)

    def runs(self) -> tuple[dict[datetime, str], bool]:
        """State of every backfill run by data interval start; and whether a backfill is open.

        The scheduler closes a backfill a few loops after its last run ends, and Airflow
        refuses a second backfill of the same DAG until then.
        """
        with self.db.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT data_interval_start, state FROM dag_run"
                    " WHERE dag_id = :dag AND run_type = 'backfill'"
                ),
                {"dag": DAG_ID},
            ).all()
            still_open = conn.scalar(
                text("SELECT count(*) FROM backfill WHERE dag_id = :dag AND completed_at IS NULL"),
                {"dag": DAG_ID},
            )
        return {at.astimezone(UTC): str(state) for at, state in rows}, still_open > 0

    def backfill(self, start: datetime, end: datetime, reprocess: str) -> dict[datetime, str]:
        """Backfill the hourly intervals in [start, end); wait until the backfill has completed.

        The CLI's dates are logical dates (interval starts), both ends included.
        """
        last = end - timedelta(hours=1)
        airflow(
            self.env, "backfill", "create", "--dag-id", DAG_ID,
            "--from-date", start.isoformat(), "--to-date", last.isoformat(),
            "--reprocess-behavior", reprocess, "--max-active-runs", "1",
        )  # fmt: skip
        hours = int((end - start) / timedelta(hours=1))
        wanted = [start + timedelta(hours=h) for h in range(hours)]
        deadline = time.monotonic() + 1500
        while time.monotonic() < deadline:
            all_runs, still_open = self.runs()
            runs = {at: state for at, state in all_runs.items() if start <= at < end}
            # A reprocessed run is cleared back to queued before it runs again.
            done = sorted(runs) == wanted and all(s in ("success", "failed") for s in runs.values())
            if done and not still_open:
                return runs
            if not still_open and sorted(runs) != wanted:
                break  # the backfill closed without creating every run: waiting cannot help
            time.sleep(3)
        tails = {p.name: p.read_text()[-3000:] for p in self.logs.iterdir()}
        raise AssertionError(f"backfill did not finish: {self.runs()}\n{tails}")

    def asset_events(self, topic: str, slice_id: str) -> list[dict]:
        with self.db.connect() as conn:
            extras = conn.scalars(text("SELECT extra FROM asset_event")).all()
        extras = [json.loads(e) if isinstance(e, str) else e for e in extras]
        return [e for e in extras if (e.get("topic"), e.get("slice_id")) == (topic, slice_id)]


@pytest.fixture
def cluster_server(spark_cluster, tmp_path) -> Iterator[SparkConnectServer]:
    """A Spark Connect server whose master is the standalone cluster."""
    (port,) = free_ports(1)
    with SparkConnectServer(tmp_path / "spark-connect", port, spark_cluster.master_url) as server:
        yield server


@pytest.fixture
def deployment(pipeline, cluster_server, postgres_url, tmp_path) -> Iterator[Deployment]:
    """api-server + scheduler + triggerer on PostgreSQL; spark_connect_default names the
    server that drives the cluster."""
    settings, _ = pipeline
    (port,) = free_ports(1)
    env = {
        # Nothing but configuration differs from the embedded default.
        **airflow_env(settings),
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_connection(cluster_server.url),
        "SLICEWISE_SPARK_REMOTE": cluster_server.url,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_url,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        # Only the backfills run: no scheduled run for the latest interval on unpause.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "SLICEWISE_GRACE_SECONDS": "0",
    }
    airflow(env, "db", "migrate")
    airflow(env, "dags", "reserialize")
    airflow(env, "dags", "unpause", DAG_ID)
    logs = tmp_path / "airflow-logs"
    logs.mkdir()
    procs = []
    for component in (["api-server", "--port", str(port)], ["scheduler"], ["triggerer"]):
        out = open(logs / f"{component[0]}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [str(VENV_BIN / "airflow"), *component],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append((proc, out))
    deployment = Deployment(env, logs, postgres_url)
    try:
        deadline = time.monotonic() + 120
        while not port_open(port):
            assert time.monotonic() < deadline, (logs / "api-server.log").read_text()[-3000:]
            time.sleep(1)
        yield deployment
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, out in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            out.close()
        deployment.db.dispose()


def slice_rows(spark, settings, slice_id: str) -> dict[str, list[tuple]]:
    """The slice's rows in every table keyed by slice: 'nothing changed' means this is equal."""
    return {
        table: sorted(
            map(
                tuple,
                spark.read.format("delta")
                .load(settings.table(table))
                .where(F.col("slice_id") == slice_id)
                .collect(),
            ),
            key=repr,
        )
        for table in ("bronze", "silver", "quarantine")
    }


def test_backfills_on_a_spark_cluster_with_airflow_on_postgres_are_exact_and_rerun_safely(
    spark, pipeline, spark_cluster, deployment
):
    settings, producer = pipeline
    start = (datetime.now(UTC) - timedelta(hours=4)).replace(minute=0, second=0, microsecond=0)
    hour_2 = start + timedelta(hours=1)
    produce_hour(producer, start)
    produce_hour(producer, hour_2, prefix="f")
    ledger = Ledger(settings.ledger_dir, settings.topic)

    first = deployment.backfill(start, hour_2, reprocess="none")
    assert list(first.values()) == ["success"], first
    [sl] = ledger.slices()  # the run's data interval, not now(), named the slice
    assert (sl.start, sl.end) == (start, hour_2)
    gate = ledger.step(sl.slice_id, "gate")
    assert gate["success"] and gate["counts"]["read"] == 22 and gate["counts"]["quarantined"] == 1
    [event] = deployment.asset_events(settings.topic, sl.slice_id)
    assert event["silver_version"] >= 1
    before = slice_rows(spark, settings, sl.slice_id)
    assert sorted(r[0] for r in before["silver"]) == sorted(f"e{i}" for i in range(20))

    # The UI's "reprocess completed runs": the done interval runs again, the new one for the first time.
    both = deployment.backfill(start, hour_2 + timedelta(hours=1), reprocess="completed")
    assert set(both.values()) == {"success"}, both
    assert slice_rows(spark, settings, sl.slice_id) == before
    slice_ids = sorted(s.slice_id for s in ledger.slices())
    assert len(slice_ids) == 2
    silver = spark.read.format("delta").load(settings.table("silver"))
    assert sorted(r.event_id for r in silver.collect()) == sorted(
        f"{p}{i}" for p in "ef" for i in range(20)
    )
    assert [len(deployment.asset_events(settings.topic, s)) for s in slice_ids] == [1, 1]

    # The Spark work ran on the cluster, in the one server application, with executors
    # on its worker; no step started an application of its own.
    state = spark_cluster.state()
    assert [a["name"] for a in state["activeapps"]] == ["slicewise-connect"], state
    assert state["activeapps"][0]["cores"] > 0, state
    assert spark_cluster.completed_apps() == [], state


def test_executors_import_the_drivers_slicewise_from_the_shipped_zip(spark_cluster, tmp_path):
    script = tmp_path / "where.py"
    script.write_text(
        "import json\n"
        "from slicewise.spark import get_spark, ship_package\n"
        "spark = get_spark('slicewise-where')\n"
        "ship_package(spark)\n"
        "rdd = spark.sparkContext.parallelize(range(4), 2)\n"
        "print(json.dumps(sorted(set(rdd.map(lambda _: __import__('slicewise').__file__).collect()))))\n"
    )
    out = subprocess.run(
        [str(VENV_BIN / "spark-submit"), "--master", spark_cluster.master_url, str(script)],
        # A spark-submit application of its own, not a client of the tests' server (whose
        # session left pyspark's connect switches in this process's environment).
        env={
            **classic_env({k: v for k, v in os.environ.items() if k != "SLICEWISE_SPARK_REMOTE"}),
            "PYSPARK_PYTHON": sys.executable,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    [where] = json.loads(out.stdout.strip().splitlines()[-1])
    # The executors' copy came from the zip Spark fetched, not from this checkout.
    assert "/slicewise-" in where and where.endswith(".zip/slicewise/__init__.py"), where
    assert not where.startswith(str(sys.prefix)), where
