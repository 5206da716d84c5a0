"""Production-shaped: the same DAG, by configuration alone, run by a real scheduler
(LocalExecutor), triggerer and api-server with the metadata DB on PostgreSQL, its Spark
steps clients of a Spark Connect server that drives a real standalone cluster, the
tables and the ledger in one bucket of an S3-compatible server (no path shared by the
Airflow worker and the executors), and backfills created with `airflow backfill create`
(what the UI's backfill form does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql import functions as F
from test_airflow_e2e import produce_hour  # same folder, on sys.path under pytest

from slicewise.connect_auth import TOKEN_ENV
from slicewise.connect_server import SparkConnectServer, connect_connection
from slicewise.ledger import Ledger
from slicewise.spark import classic_env
from slicewise_dev.airflow_env import VENV_BIN, airflow_env
from slicewise_dev.airflow_services import AirflowServices
from slicewise_dev.broker import free_ports

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster_server(spark_cluster, tmp_path) -> Iterator[SparkConnectServer]:
    """A Spark Connect server whose master is the standalone cluster."""
    (port,) = free_ports(1)
    with SparkConnectServer(tmp_path / "spark-connect", port, spark_cluster.master_url) as server:
        yield server


@pytest.fixture
def on_s3(pipeline_factory, s3_lakehouse):
    """Tables and ledger in a bucket: SLICEWISE_LAKEHOUSE=s3a://<bucket>/lakehouse."""
    return pipeline_factory(SLICEWISE_LAKEHOUSE=s3_lakehouse)


@pytest.fixture
def deployment(on_s3, cluster_server, postgres_url, tmp_path) -> Iterator[AirflowServices]:
    """api-server + scheduler + triggerer on PostgreSQL; spark_connect_default names the
    server that drives the cluster."""
    settings, _ = on_s3
    env = {
        # Nothing but configuration differs from the embedded default.
        **airflow_env(settings),
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_connection(
            cluster_server.url, cluster_server.token
        ),
        "SLICEWISE_SPARK_REMOTE": cluster_server.url,
        TOKEN_ENV: cluster_server.token,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_url,
        "SLICEWISE_GRACE_SECONDS": "0",
    }
    with AirflowServices(env, tmp_path / "airflow-logs", triggerer=True) as services:
        yield services


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


def test_backfills_on_a_spark_cluster_with_airflow_on_postgres_and_tables_on_s3_are_exact(
    spark, on_s3, spark_cluster, deployment, local_s3, tmp_path
):
    settings, producer = on_s3
    assert settings.lakehouse.startswith("s3a://") and settings.ledger_dir.startswith("s3a://")
    start = (datetime.now(timezone.utc) - timedelta(hours=4)).replace(
        minute=0, second=0, microsecond=0
    )
    hour_2 = start + timedelta(hours=1)
    produce_hour(producer, start)
    produce_hour(producer, hour_2, prefix="f")
    ledger = Ledger(settings.ledger_dir, settings.topic)

    first = deployment.backfill(start, hour_2, reprocess="none")
    assert [r.state for r in first.values()] == ["success"], first
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
    assert {r.state for r in both.values()} == {"success"}, both
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
    # Nothing of the pipeline's on local disk: tables and ledger are objects in the bucket.
    assert not (settings.state_dir / "lakehouse").exists()
    assert any(k.startswith("boundaries/") for k in ledger.store.keys("boundaries"))
    # The secret key reached the executors, yet no log of Airflow, the server or the
    # cluster holds it: only the server's 0600 credentials file does.
    logs = [p for root in (tmp_path, spark_cluster.home) for p in root.rglob("*") if p.is_file()]
    leaked = [
        p
        for p in logs
        if p.name != "secrets.properties" and local_s3.secret_key in p.read_text(errors="replace")
    ]
    assert len(logs) > 10 and leaked == [], leaked


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
