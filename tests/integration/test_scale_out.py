"""Production-shaped, across hosts: the same DAG, by configuration alone, run by a real
scheduler, triggerer and api-server with the metadata DB on PostgreSQL and its tasks on
a Celery worker of another host (a network namespace, slicewise_dev.netns), its Spark
steps clients of a Spark Connect server that drives a real standalone cluster whose
worker, and so every executor, is a third host. Whatever those hosts reach (the
api-server, Redis, the master, the server's driver, the broker, the object store)
listens on the namespaces' gateway and nowhere else they could reach: no loopback
shortcut. The tables and the ledger are in one bucket (no path shared by the Airflow
worker and the executors); the scheduler runs the latest hour, and a backfill is
created with `airflow backfill create` (what the UI's backfill form does)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlparse

import pytest

from slicewise.config import Settings, load_settings
from slicewise.connect_auth import TOKEN_ENV
from slicewise.connect_server import SparkConnectServer, connect_connection
from slicewise.ledger import Ledger
from slicewise.spark import classic_env, remote_session
from slicewise_dev.airflow_env import VENV_BIN, airflow_env
from slicewise_dev.airflow_services import AirflowServices, Celery
from slicewise_dev.broker import free_ports, running_broker
from slicewise_dev.netns import Hosts
from slicewise_dev.redis import LocalRedis
from slicewise_dev.s3 import LocalS3
from slicewise_dev.source import Faults, produce
from slicewise_dev.spark_cluster import LocalSparkCluster

pytestmark = pytest.mark.integration

# The deployment's sizing for hour-long slices on its cluster (docs/DEPLOYING.md): as
# many shuffle and Delta snapshot partitions as the executors have cores (the executor
# host's 2), not Spark's 200 and Delta's 50.
SLICE_SIZED = {
    "spark.sql.shuffle.partitions": "2",
    "spark.databricks.delta.snapshotPartitions": "2",
}
FAULTS = Faults(duplicate_rate=0.05, aborted_rate=0.1, malformed_rate=0.05, drift_rate=0.05)


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with Hosts() as made:
        yield made


@pytest.fixture(scope="module")
def executor_host(hosts: Hosts) -> tuple[str, str]:
    """(namespace, address) of the host the cluster's worker and executors run on."""
    return hosts.add("executor")


@pytest.fixture(scope="module")
def airflow_host(hosts: Hosts) -> tuple[str, str]:
    """(namespace, address) of the host the Celery worker, and so every task, runs on."""
    return hosts.add("airflow")


@dataclass(frozen=True)
class Gateway:
    bootstrap: str
    s3: LocalS3
    redis: LocalRedis


@pytest.fixture(scope="module")
def spark_cluster(hosts, executor_host, tmp_path_factory) -> Iterator[LocalSparkCluster]:
    """Master on the gateway, the worker (1 worker, 2 cores) on the executor host."""
    home = tmp_path_factory.mktemp("spark-cluster")
    with LocalSparkCluster(home, master_host=hosts.gateway, worker=executor_host) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def services(hosts, tmp_path_factory) -> Iterator[Gateway]:
    """A Kafka broker, an object store and Celery's Redis on the gateway (the shared ones
    listen on loopback, which the other hosts cannot reach); the object store's endpoint
    and credentials in the environment, as `local_s3` does, for the server, the tasks
    and the ledger."""
    state = tmp_path_factory.mktemp("gateway-services")
    cache = load_settings().cache_dir
    with (
        running_broker(state / "kafka", host=hosts.gateway) as broker,
        LocalS3(state / "s3", cache, host=hosts.gateway) as s3,
        LocalRedis(state / "redis", host=hosts.gateway) as redis,
        pytest.MonkeyPatch.context() as env,
    ):
        for name, value in s3.env.items():
            env.setenv(name, value)
        yield Gateway(broker.bootstrap, s3, redis)


@pytest.fixture
def cluster_server(hosts, spark_cluster, services, tmp_path):
    """A Spark Connect server whose master is the cluster; its driver (and UI) on the
    gateway, where executors dial it back (`--bind`, `--driver-host`)."""
    port, ui = free_ports(2)
    with SparkConnectServer(
        tmp_path / "spark-connect", port, spark_cluster.master_url, bind=hosts.gateway,
        driver_host=hosts.gateway, extra_conf={"spark.ui.port": str(ui), **SLICE_SIZED},
    ) as server:  # fmt: skip
        yield server, f"http://{hosts.gateway}:{ui}/api/v1/applications"


@pytest.fixture
def on_s3(services, cluster_server, tmp_path, request) -> Settings:
    """Settings of a pipeline on the gateway's broker, with its tables and ledger in a
    bucket (SLICEWISE_LAKEHOUSE=s3a://<bucket>/lakehouse)."""
    server, _ = cluster_server
    return load_settings(
        {
            **os.environ,
            "SLICEWISE_KAFKA_BOOTSTRAP": services.bootstrap,
            "SLICEWISE_SPARK_REMOTE": server.url,
            "SLICEWISE_TOPIC": f"scale-out-{abs(hash(request.node.nodeid)) % 10**8}",
            "SLICEWISE_STATE_DIR": str(tmp_path / "state"),
            "SLICEWISE_LAKEHOUSE": f"s3a://{services.s3.create_bucket('lake')}/lakehouse",
        }
    )


@dataclass(frozen=True)
class Stream:
    hours: list[datetime]
    committed: set[str]  # the oracle: every committed valid event id of the hours
    malformed: list[set[tuple[int, int]]]  # (partition, offset) of each hour's malformed records


@pytest.fixture
def stream(on_s3: Settings) -> Stream:
    """An old hour for a backfill and the latest closed one for the scheduler, each a
    faulty stream (slicewise_dev.source: duplicates, aborted transactions, malformed
    records, a new field) with its oracle, produced before Airflow starts."""
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    hours = [now - timedelta(hours=3), now - timedelta(hours=1)]
    made = [
        produce(on_s3, hour, 1, 60, FAULTS, seed=k, batch=10, id_prefix=f"h{k}-")
        for k, hour in enumerate(hours)
    ]
    return Stream(
        hours, set().union(*(m.committed_valid for m in made)), [m.malformed for m in made]
    )


@pytest.fixture
def deployment(
    hosts, airflow_host, services, on_s3, stream, cluster_server, postgres_url, tmp_path
) -> Iterator[AirflowServices]:
    """api-server (on the gateway) + scheduler + triggerer on PostgreSQL, CeleryExecutor
    with its worker on the Airflow host; spark_connect_default names the server that
    drives the cluster. The DAG runs on its schedule too."""
    settings = on_s3
    server, _ = cluster_server
    env = {
        # Nothing but configuration differs from the embedded default.
        **airflow_env(settings),
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_connection(server.url, server.token),
        "SLICEWISE_SPARK_REMOTE": server.url,
        TOKEN_ENV: server.token,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_url,
        "SLICEWISE_GRACE_SECONDS": "0",
    }
    worker = Celery(services.redis.url(), worker_ns=airflow_host[0])
    with AirflowServices(
        env, tmp_path / "airflow-logs", triggerer=True, host=hosts.gateway, celery=worker,
        scheduled=True,
    ) as airflow:  # fmt: skip
        yield airflow


def test_runs_on_other_hosts_with_tables_on_s3_are_exact(
    on_s3, stream, spark_cluster, cluster_server, deployment, services, executor_host,
    airflow_host, tmp_path,
):  # fmt: skip
    settings = on_s3
    server, spark_api = cluster_server
    assert settings.lakehouse.startswith("s3a://") and settings.ledger_dir.startswith("s3a://")
    start, latest = stream.hours
    ledger = Ledger.of(settings)

    # The scheduler's run of the latest closed hour, beside a backfill of an old one.
    [backfilled] = deployment.backfill(
        start,
        start + timedelta(hours=1),
        until_closed=False,  # no second backfill follows
    ).values()
    assert backfilled.state == "success", backfilled
    assert deployment.wait_for_scheduled_success(at=latest) == latest
    # The runs' data intervals, not now(), named the slices. A test that runs across the
    # hour also sees the scheduler rightly run the hour that closed meanwhile (no events).
    slices = [s for s in ledger.slices() if s.start <= latest]
    assert [(s.start, s.end) for s in slices] == [
        (at, at + timedelta(hours=1)) for at in (start, latest)
    ]
    for sl, malformed in zip(slices, stream.malformed, strict=True):
        gate = ledger.step(sl.slice_id, "gate")
        assert gate["success"] and gate["counts"]["quarantined"] == len(malformed), gate
        [event] = deployment.asset_events(settings.topic, sl.slice_id)
        assert event["silver_version"] >= 1
    # Every task ran on the Celery worker, on the Airflow host.
    ran_on = deployment.task_hosts()
    assert len(ran_on) >= 2 * 5 and set(ran_on.values()) == {airflow_host[1]}, ran_on

    # The gate's Data Docs are in the bucket: fetched with the CLI from this host, once
    # the site the gate rendered on its own disk is gone.
    docs = ledger.step(slices[0].slice_id, "gate")["data_docs"]
    assert docs and all(u.startswith(f"{settings.lakehouse}/") for u in docs), docs
    shutil.rmtree(settings.data_docs_dir)
    fetched = subprocess.run(
        [str(VENV_BIN / "slicewise"), "docs", "--slice-id", slices[0].slice_id,
         "--into", str(tmp_path / "docs")],
        env=deployment.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    [page] = [Path(urlparse(u).path) for u in fetched.stdout.split()]
    assert slices[0].slice_id in page.read_text() and (tmp_path / "docs" / "static").is_dir()

    spark = remote_session(server.url, token=server.token, fresh=True)
    silver = spark.read.format("delta").load(settings.table("silver"))
    assert sorted(r.event_id for r in silver.collect()) == sorted(stream.committed)  # the oracle
    quarantine = spark.read.format("delta").load(settings.table("quarantine")).collect()
    assert sorted((r.partition, r.offset) for r in quarantine) == sorted(
        set().union(*stream.malformed)
    )
    spark.stop()

    # The Spark work ran on the cluster, in the one server application, and its tasks on
    # the other host's executors (Spark's own REST API); no step started an application.
    state = spark_cluster.state()
    assert [a["name"] for a in state["activeapps"]] == ["slicewise-connect"], state
    assert spark_cluster.completed_apps() == [], state
    [app] = fetch(spark_api)
    executors = fetch(f"{spark_api}/{app['id']}/allexecutors")
    ran = [e for e in executors if e["id"] != "driver" and e["totalTasks"] > 0]
    _, executor_address = executor_host
    assert ran and {e["hostPort"].split(":")[0] for e in ran} == {executor_address}, executors
    # Nothing of the pipeline's on local disk: tables and ledger are objects in the bucket.
    assert not (settings.state_dir / "lakehouse").exists()
    assert any(k.startswith("boundaries/") for k in ledger.store.keys("boundaries"))
    # The secret key reached the executors, yet no log of Airflow, the server or the
    # cluster holds it: only the server's 0600 credentials file does.
    s3 = services.s3
    logs = [p for root in (tmp_path, spark_cluster.home) for p in root.rglob("*") if p.is_file()]
    leaked = [
        p
        for p in logs
        if p.name != "secrets.properties" and s3.secret_key in p.read_text(errors="replace")
    ]
    assert len(logs) > 10 and leaked == [], leaked


def fetch(url: str) -> list:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)


def test_executors_import_the_drivers_slicewise_from_the_shipped_zip(
    hosts, spark_cluster, tmp_path
):
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
            "SPARK_LOCAL_IP": hosts.gateway,  # where the executor host dials the driver
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
