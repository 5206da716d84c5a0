"""Shared fixtures. Integration tests run against a real Kafka broker: ours, started
once per session on free loopback ports, or an external one named by
SLICEWISE_KAFKA_BOOTSTRAP (with SLICEWISE_KAFKA_PROP_* for its security settings)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

# A throwaway Airflow home with its own SQLite DB, set before anything imports airflow.
_AIRFLOW_HOME = tempfile.mkdtemp(prefix="slicewise-airflow-")
os.environ.update(
    {
        "AIRFLOW_HOME": _AIRFLOW_HOME,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(__file__).resolve().parents[1] / "dags"),
        # Wait for SQLite's lock when a scheduler and the test both write (as airflow_env does).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME}/airflow.db?timeout=60",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "PYARROW_IGNORE_TIMEZONE": "1",
    }
)

import pytest
import shared_services
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from slicewise.config import load_settings
from slicewise.connect_auth import TOKEN_ENV
from slicewise.connect_server import SparkConnectServer, connect_connection
from slicewise.spark import remote_session
from slicewise_dev.broker import running_broker
from slicewise_dev.s3 import LocalS3

# The suite runs on two xdist workers, one test file per worker at a time (`-n 2
# --dist loadfile` in pyproject.toml): most tests wait on Airflow, a broker or a JVM
# part of the time, so two of them overlap on two cores. The longest files go first
# (`--no-loadscope-reorder` keeps this order; xdist would put the files with the most
# tests first), so that none of them is left running alone at the end. The two that
# load the machine most, scale_out (a cluster's JVMs, Celery, PostgreSQL) and the
# browser test (Chromium beside Airflow), run one after the other on one worker: xdist
# queues a second file on a worker whose first has at most two tests left, so the
# browser test, third here, goes behind scale_out's two. Side by side (CI, 2026-11-29)
# they took 514 and 572 s, against 245 and 175 s alone.
LONGEST_FIRST = (
    "test_scale_out",
    "test_airflow_e2e",
    "test_airflow_browser",
    "test_two_pipelines",
    "test_core",
    "test_airflow_ui",
    "test_chaos",
    "test_idempotence",
    "test_object_store",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.stem
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: a file's own order is kept


_SERVICES = pytest.StashKey[contextlib.ExitStack]()


def _runs_shared_services(config: pytest.Config) -> bool:
    """The controller of a run with xdist workers that goes beyond the unit tier."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return False
    unit = Path(__file__).parent / "unit"
    return any(not Path(arg.split("::")[0]).resolve().is_relative_to(unit) for arg in config.args)


def pytest_configure(config: pytest.Config) -> None:
    """The controller starts the services every worker shares (tests/shared_services.py)."""
    if not _runs_shared_services(config):
        return
    root = Path(tempfile.mkdtemp(prefix="slicewise-services-"))
    stack = contextlib.ExitStack()
    config.stash[_SERVICES] = stack
    stack.callback(shutil.rmtree, root, ignore_errors=True)
    began = time.monotonic()
    run = stack.enter_context(
        shared_services.started(root, Path(sys.executable).parent / "airflow")
    )
    os.environ.update(shared_services.publish(run, root))  # the workers inherit it
    print(f"shared services up in {time.monotonic() - began:.0f} s: broker {run.bootstrap}, "
          f"Spark Connect {run.server.url}, s3proxy {run.s3.endpoint}, "
          f"registry {run.registry.url}, PostgreSQL :{run.postgres.port}")  # fmt: skip
    config.pluginmanager.register(Timeline(), "slicewise-timeline")  # the workers start now


class Timeline:
    """What each xdist worker spent, seen from the controller: its busy seconds (every
    phase of every test), when it finished its last test, and the files that cost most.
    Printed just before pytest's slowest tests, so a worker left alone at the end, or a file
    that grew, shows at once."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.busy: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.files: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None)
        if worker is None:
            return
        self.busy[worker] = self.busy.get(worker, 0.0) + report.duration
        self.ended[worker] = time.monotonic() - self.began
        path = report.nodeid.split("::")[0]
        self.files[path] = self.files.get(path, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.busy:
            return
        write = terminalreporter.write_line
        terminalreporter.section("where each worker's time went")
        for worker in sorted(self.busy):
            write(
                f"{worker}: busy {self.busy[worker]:.0f} s, last test ended "
                f"{self.ended[worker]:.0f} s after the workers started"
            )
        write("costliest files (seconds of every phase of their tests):")
        for path, seconds in sorted(self.files.items(), key=lambda kv: -kv[1])[:15]:
            write(f"  {seconds:7.0f}  {path}")


def pytest_unconfigure(config: pytest.Config) -> None:
    if stack := config.stash.get(_SERVICES, None):
        stack.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """bootstrap.servers of the broker the integration tests use: an external one, the
    run's shared one, or one of this process's own."""
    external = os.environ.get("SLICEWISE_KAFKA_BOOTSTRAP", "").strip()
    if external:
        yield external
        return
    if run := shared_services.shared():
        yield run.bootstrap
        return
    with running_broker(tmp_path_factory.mktemp("state")) as broker:
        yield broker.bootstrap


@pytest.fixture
def new_topic(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """Factory: `new_topic(partitions=3, config={...})` creates a uniquely named topic
    and returns its name once every partition has a leader; deleted after the test."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap, **load_settings().kafka_props})
    created: list[str] = []

    def create(partitions: int = 3, config: Mapping[str, str] | None = None) -> str:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:100]
        name = f"{stem}-{uuid.uuid4().hex[:8]}"
        # replication_factor=-1: the broker's default, so external clusters work too.
        topic = NewTopic(
            name, num_partitions=partitions, replication_factor=-1, config=dict(config or {})
        )
        admin.create_topics([topic])[name].result(timeout=30)
        created.append(name)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meta = admin.list_topics(name, timeout=10).topics[name]
            if (
                meta.error is None
                and len(meta.partitions) == partitions
                and all(p.leader >= 0 for p in meta.partitions.values())
            ):
                return name
            time.sleep(0.1)
        raise TimeoutError(f"topic {name} has no leader for every partition after 30s")

    yield create
    if created:
        for future in admin.delete_topics(created).values():
            with contextlib.suppress(Exception):  # best effort: tidiness, not correctness
                future.result(timeout=30)


@pytest.fixture(scope="session")
def local_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    """s3proxy (filesystem-nio2 backend): the tests' object store, the run's shared one
    or this process's own. Its endpoint and credentials go into the environment, in the
    variables AWS SDKs read, so the ledger (obstore) and Airflow's tasks find it."""
    with contextlib.ExitStack() as own:
        if run := shared_services.shared():
            server = run.s3
        else:
            server = own.enter_context(
                LocalS3(tmp_path_factory.mktemp("s3"), load_settings().cache_dir)
            )
        with shared_services.environ(server.env):
            yield server


@pytest.fixture(scope="session")
def connect_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[SparkConnectServer | None]:
    """The one Spark Connect server the whole run shares (Delta + Kafka connector, UI
    off, 2 shuffle partitions, the object store's credentials): the run's shared one, or
    this process's own on a free port; None for an external one named by
    SLICEWISE_SPARK_REMOTE (with its token in SLICEWISE_SPARK_TOKEN). Its URL, token and
    Airflow connection are set in the environment, so steps run through the CLI, Airflow
    tasks and the chaos suite's subprocesses are its clients too."""
    if os.environ.get("SLICEWISE_SPARK_REMOTE", "").strip():
        yield None
        return
    with contextlib.ExitStack() as own:
        if run := shared_services.shared():
            server = run.server
        else:  # after the S3 server, so that s3a:// tables work
            server = shared_services.connect_server(
                tmp_path_factory.mktemp("spark-connect"), request.getfixturevalue("local_s3")
            )
            own.callback(server.stop)
        # The server's token, in the environment: every client of the run (steps, the
        # CLI, Airflow tasks, the chaos suite's subprocesses) sends it, whatever its state.
        os.environ[TOKEN_ENV] = server.token
        os.environ["SLICEWISE_SPARK_REMOTE"] = server.url
        os.environ["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = connect_connection(
            server.url, server.token
        )
        try:
            yield server
        finally:
            for name in ("SLICEWISE_SPARK_REMOTE", "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", TOKEN_ENV):
                os.environ.pop(name, None)


@pytest.fixture(scope="session")
def spark_remote(connect_server: SparkConnectServer | None) -> str:
    """sc:// URL of the run's Spark Connect server (the `connect_server` fixture)."""
    return connect_server.url if connect_server else os.environ["SLICEWISE_SPARK_REMOTE"]


@pytest.fixture(scope="session")
def spark(spark_remote: str) -> Iterator[SparkSession]:
    """One client session of the shared server for the whole run."""
    session = remote_session(spark_remote, "slicewise-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """A migrated SQLite metadata DB in the throwaway AIRFLOW_HOME."""
    from airflow.utils import db

    db.initdb()
    return _AIRFLOW_HOME
