"""Per-test pipelines (a fresh topic, a fresh lakehouse, a transactional producer), and the
production-shaped services: PostgreSQL (the Spark cluster, on another host, is
test_scale_out's)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
import shared_services
from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator

from slicewise.config import Settings, load_settings
from slicewise_dev.producer import TxProducer
from slicewise_dev.registry import LocalRegistry
from slicewise_dev.s3 import LocalS3  # noqa: TC001 - a fixture's type


def _forget_release_pool(cls: type[ExecutePlanResponseReattachableIterator]) -> None:
    """A Connect client's close, for the harness: forget the ReleaseExecute pool that
    every client of the process shares instead of shutting it down. Its idle workers
    exit once it is collected, a release already queued still runs, and the next
    iterator makes a new pool.

    PySpark 4.1's `SparkSession.__del__` closes its client, and that close shut the
    shared pool down. The harness drops sessions (`remote_session(..., fresh=True)`,
    stopped, then collected whenever Python's cycle collector runs), and the collector
    can run inside that pool's own `submit` or one of its workers: the shutdown then
    waits for a lock its own thread holds, or joins its own pool. Both CI workers hung so
    in a gate's side-by-side queries on 2026-11-30. Upstream: SPARK-55362, SPARK-55406
    (the pool reimplemented, no shared shutdown). A step of ours opens one session per
    process; the harness runs many tests, and their sessions, in one."""
    with cls._lock:
        cls._release_thread_pool_instance = None


if hasattr(ExecutePlanResponseReattachableIterator, "_release_thread_pool_instance"):
    ExecutePlanResponseReattachableIterator.shutdown = classmethod(_forget_release_pool)


@pytest.fixture
def pipeline_factory(
    kafka_bootstrap: str,
    spark_remote: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., tuple[Settings, TxProducer]]]:
    """`pipeline_factory(topic=None, **env)`: settings for a new lakehouse (and topic),
    whose steps are clients of the shared Spark Connect server."""
    producers: list[TxProducer] = []

    def make(
        topic: str | None = None, partitions: int = 3, **env: str
    ) -> tuple[Settings, TxProducer]:
        topic = topic or new_topic(partitions)
        state = tmp_path_factory.mktemp("state")
        settings = load_settings(
            {
                **os.environ,
                "SLICEWISE_KAFKA_BOOTSTRAP": kafka_bootstrap,
                "SLICEWISE_SPARK_REMOTE": spark_remote,
                "SLICEWISE_TOPIC": topic,
                "SLICEWISE_STATE_DIR": str(state),
                "SLICEWISE_LAKEHOUSE": str(state / "lakehouse"),
                **env,
            }
        )
        producer = TxProducer(
            {"bootstrap.servers": kafka_bootstrap, **settings.kafka_props},
            topic,
            f"tx-{topic}-{len(producers)}",
        )
        producers.append(producer)
        return settings, producer

    yield make


@pytest.fixture
def pipeline(
    pipeline_factory: Callable[..., tuple[Settings, TxProducer]],
) -> tuple[Settings, TxProducer]:
    return pipeline_factory()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """Apicurio Registry (its Confluent-compatible API): the run's shared one, or one of
    this process's own on a free loopback port."""
    if run := shared_services.shared():
        yield run.registry
        return
    with LocalRegistry(tmp_path_factory.mktemp("registry"), load_settings().cache_dir) as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Callable[[str], str]]:
    """A private PostgreSQL server (the run's shared one, or this process's own); yields
    `new_database(name)`, which creates a database with Airflow's schema already
    migrated (a copy of the server's template) and returns its SQLAlchemy URL."""
    if run := shared_services.shared():
        yield run.postgres.new_airflow_database
        return
    server = shared_services.Postgres()
    server.start()
    try:
        yield server.new_airflow_database
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: Callable[[str], str]) -> str:
    """A database of its own for one test's Airflow metadata."""
    return postgres_server(f"airflow_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def s3_lakehouse(local_s3: LocalS3, request: pytest.FixtureRequest) -> str:
    """A lakehouse URL in a fresh bucket of the tests' S3 server."""
    bucket = local_s3.create_bucket(f"lake-{abs(hash(request.node.nodeid)) % 10**8}")
    return f"s3a://{bucket}/lakehouse"
