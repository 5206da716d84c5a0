"""The test run's shared services: one Kafka broker, one s3proxy, one Spark Connect server,
one schema registry and one PostgreSQL server for the whole run, however many xdist
workers it has.

Before, each worker started its own set (five JVMs and a PostgreSQL server a worker,
started while the other worker's tests ran). Now pytest's controller process starts them
once, side by side, before the workers start (`pytest_configure` in tests/conftest.py),
and stops them after the workers end. It writes their handles (pickled, without their
processes) to a file named by SLICEWISE_TEST_SERVICES, which the workers inherit: the
session fixtures of tests/conftest.py hand those handles to the tests, which see the
same objects as before. A worker's handle owns no process, so nothing a test does to
it stops a service the other worker uses. A run without workers (`-n 0`) starts each
service in its fixture, as before, when a test first asks for it.

PostgreSQL keeps a template database with Airflow's schema migrated once: each test's
database is a copy of it (`createdb -T`), so an Airflow stack's own `airflow db migrate`
finds nothing to do.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from slicewise.config import load_settings
from slicewise.connect_server import SparkConnectServer
from slicewise_dev.broker import LocalBroker, free_ports
from slicewise_dev.registry import LocalRegistry
from slicewise_dev.s3 import LocalS3

SERVICES_ENV = "SLICEWISE_TEST_SERVICES"
AIRFLOW_TEMPLATE = "airflow_template"


# The tests' Spark Connect servers collect garbage with the throughput collector: on two
# cores the suite's CPU is mostly the shared server's (68 % in a fresh-clone run,
# 2026-12-02), and G1's GC threads took a tenth of it. On the same Spark-heavy tests
# (two runs each, alternating), ParallelGC took 371 s of CPU against 413 s, and 243 s
# of wall time against 268 s. A JVM choice only: no setting of Spark's or Delta's
# differs from the product's.
TEST_SERVER_JVM = {"spark.driver.extraJavaOptions": "-XX:+UseParallelGC"}


def connect_server(home: Path, s3: LocalS3) -> SparkConnectServer:
    """The run's Spark Connect server, with the object store's credentials for s3a://.

    Its `spark` session lives as long as the run and idles while a test drives Airflow or
    a chaos run for minutes; the product's 10 minutes (server_conf, for dead clients)
    closed it mid-run on a slow CI host, failing every later test of its worker."""
    (port,) = free_ports(1)
    with environ(s3.env):  # the server's executors read them at start
        server = SparkConnectServer(
            home, port, "local[2]", token=secrets.token_urlsafe(32),
            extra_conf={
                "spark.connect.session.manager.defaultSessionTimeout": "4h",
                **TEST_SERVER_JVM,
            },
        )  # fmt: skip
        server.start()
    return server


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ for the block; what they replaced is put back after it."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class Postgres:
    """A private PostgreSQL server (Debian's package) on a free loopback port.

    PostgreSQL refuses to run as root, so under root (CI) it runs as the package's
    `postgres` user, in a folder that user owns."""

    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="slicewise-pg-")))
    port: int = field(default_factory=lambda: free_ports(1)[0])
    template: bool = False  # AIRFLOW_TEMPLATE holds Airflow's migrated schema

    @property
    def bindir(self) -> Path:
        versions = sorted(
            Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3])
        )
        if not versions:
            raise RuntimeError(
                "PostgreSQL server binaries not found under /usr/lib/postgresql: "
                "apt-get install postgresql (make test does)"
            )
        return versions[-1].parent

    def _pg(self, tool: str, *args: str) -> None:
        as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_owner, str(self.bindir / tool), *args], check=True, capture_output=True)

    def url(self, name: str) -> str:
        return f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.home, "postgres", "postgres")
        data = self.home / "data"
        self._pg("initdb", "-D", str(data), "-U", "airflow", "--auth=trust", "-E", "UTF8")
        self._pg(
            "pg_ctl", "-D", str(data), "-l", str(self.home / "server.log"), "-w", "-t", "60",
            "-o", f"-p {self.port} -k {self.home} -c listen_addresses=127.0.0.1", "start",
        )  # fmt: skip

    def migrate_template(self, airflow: Path) -> None:
        """Airflow's schema, migrated once into the template each test's database copies."""
        self.create(AIRFLOW_TEMPLATE)
        home = Path(tempfile.mkdtemp(prefix="slicewise-airflow-template-"))
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.url(AIRFLOW_TEMPLATE),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
        try:
            subprocess.run(
                [str(airflow), "db", "migrate"], env=env, check=True, capture_output=True
            )
        finally:
            shutil.rmtree(home, ignore_errors=True)
        self.template = True

    def create(self, name: str, template: str | None = None) -> str:
        """An empty database (or a copy of `template`); its SQLAlchemy URL."""
        copy = ["-T", template] if template else []
        self._pg("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "airflow", *copy, name)
        return self.url(name)

    def new_airflow_database(self, name: str) -> str:
        """A database for Airflow: a copy of the migrated template once there is one."""
        return self.create(name, AIRFLOW_TEMPLATE if self.template else None)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._pg("pg_ctl", "-D", str(self.home / "data"), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.home, ignore_errors=True)


@dataclass
class Services:
    """Handles of the run's services, as the fixtures hand them out."""

    bootstrap: str
    s3: LocalS3
    server: SparkConnectServer
    registry: LocalRegistry
    postgres: Postgres


def _handle(service: object) -> object:
    """A copy of a service handle without its process (a Popen cannot cross processes;
    a handle without one stops nothing: SparkConnectServer's finds its pid file)."""
    copy = object.__new__(type(service))
    copy.__dict__.update(
        {k: (None if k in ("_proc", "_child") else v) for k, v in vars(service).items()}
    )
    return copy


@contextlib.contextmanager
def started(root: Path, airflow: Path) -> Iterator[Services]:
    """Every shared service, started side by side; stopped at the end of the block."""
    cache = load_settings().cache_dir
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(4) as pool:
        lock = threading.Lock()

        def owned(start: Callable[[], object], stop: Callable[[object], None]) -> object:
            service = start()
            with lock:
                stack.callback(stop, service)
            return service

        def broker() -> LocalBroker:
            port, controller = free_ports(2)
            made = LocalBroker(root / "kafka", cache, port=port, controller_port=controller)
            made.start(timeout=120)
            return made

        def s3() -> LocalS3:
            made = LocalS3(root / "s3", cache)
            made.start()
            return made

        def registry() -> LocalRegistry:
            made = LocalRegistry(root / "registry", cache)
            made.start()
            return made

        def postgres() -> Postgres:
            made = Postgres()
            made.start()
            made.migrate_template(airflow)
            return made

        s3_ = pool.submit(owned, s3, LocalS3.stop)
        futures = {
            "broker": pool.submit(owned, broker, LocalBroker.stop),
            "registry": pool.submit(owned, registry, LocalRegistry.stop),
            "postgres": pool.submit(owned, postgres, Postgres.stop),
        }
        server = owned(
            lambda: connect_server(root / "spark-connect", s3_.result()), SparkConnectServer.stop
        )
        yield Services(
            futures["broker"].result().bootstrap,
            s3_.result(),
            server,
            futures["registry"].result(),
            futures["postgres"].result(),
        )


def publish(services: Services, root: Path) -> dict[str, str]:
    """Write the handles for the workers; the environment that names them."""
    path = root / "services.pickle"
    handles = Services(
        services.bootstrap,
        _handle(services.s3),
        _handle(services.server),
        _handle(services.registry),
        services.postgres,
    )
    path.write_bytes(pickle.dumps(handles))
    return {SERVICES_ENV: str(path)}


def shared() -> Services | None:
    """The run's shared services, in a worker of a run that has them; else None."""
    path = os.environ.get(SERVICES_ENV)
    return pickle.loads(Path(path).read_bytes()) if path else None
