"""A real single-node Apache Kafka broker on loopback, for the tests and the demo.

No mocks and no Docker: the broker jars come from Maven Central once (pinned in
`scripts/kafka/pom.xml`), and `kafka.Kafka` runs as a detached JVM in KRaft
combined mode (broker and controller in one process). Everything it writes --
data, config, log, pid file -- lives under `<state_dir>/kafka`, so deleting that
folder is a full reset.

    python -m slicewise_dev.broker start|stop|status [--state-dir D] [--cache-dir C]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from slicewise.config import load_settings
from slicewise.connect_server import port_open
from slicewise.home import REPO_ROOT

KAFKA_VERSION = "4.1.1"  # keep in step with kafka.version in scripts/kafka/pom.xml
KAFKA_POM = REPO_ROOT / "scripts" / "kafka" / "pom.xml"
HEALTHCHECK_TRANSACTIONAL_ID = "slicewise-broker-healthcheck"

# Console only: the JVM's stdout goes to server.log, so log4j output, JVM errors
# and crashes all land in the one file, and no appender points at a missing path.
LOG4J2_PROPERTIES = """\
status = warn
name = slicewise-kafka
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
# One line per request is far too chatty for a local broker.
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.request_channel.name = kafka.network.RequestChannel$
logger.request_channel.level = WARN
"""


class BrokerError(RuntimeError):
    """The local broker could not be fetched, formatted, started or stopped; the message says why."""


class LocalBroker:
    """One Kafka 4.1 broker+controller on 127.0.0.1 (or `host`), driven from Python.

    Every method is idempotent, so a test fixture, the demo and a developer's
    shell can all call `start()` and share one broker per state folder.
    """

    def __init__(
        self,
        state_dir: Path,
        cache_dir: Path,
        port: int = 19092,
        controller_port: int = 19093,
        sasl_port: int | None = None,
        sasl_users: Mapping[str, str] | None = None,
        advertised_port: int | None = None,
        acls: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        """`sasl_port` adds a SASL_PLAINTEXT listener (mechanism PLAIN) for `sasl_users`
        (name -> password) beside the plain one, to test authenticated clients; with
        `acls` those users may do only what an ACL grants them (the plain listener's
        anonymous clients are super users, to grant them). `advertised_port` makes
        clients come back through a proxy on that port. `host`: the address it listens
        on and advertises, for clients on other hosts (slicewise_dev.netns's gateway)."""
        # Absolute: the JVM runs in `home`, and the pid check matches the config path.
        self.home = Path(state_dir).expanduser().resolve() / "kafka"
        self.libs_dir = Path(cache_dir).expanduser().resolve() / f"kafka-{KAFKA_VERSION}" / "libs"
        self.port = port
        self.controller_port = controller_port
        self.sasl_port = sasl_port
        self.advertised_port = advertised_port or port
        self.sasl_users = dict(sasl_users or {})
        self.acls = acls
        self.host = host
        self._proc: subprocess.Popen[bytes] | None = None

    # -- paths -------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """What clients put in bootstrap.servers."""
        return f"{self.host}:{self.advertised_port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def config_path(self) -> Path:
        return self.home / "server.properties"

    @property
    def log4j_path(self) -> Path:
        return self.home / "log4j2.properties"

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    @property
    def pid_path(self) -> Path:
        return self.home / "broker.pid"

    # -- jars --------------------------------------------------------------

    def ensure_jars(self) -> Path:
        """Copy the broker jars out of Maven Central unless a complete copy is cached.

        The copy lands in a scratch folder that is renamed into place with its
        marker already inside, so an interrupted download is never mistaken for
        a finished one. The marker holds the pom's hash: editing the pom refetches.
        """
        digest = hashlib.sha256(KAFKA_POM.read_bytes()).hexdigest()[:12]
        marker = self.libs_dir / ".complete"
        if marker.is_file() and marker.read_text().strip() == digest:
            return self.libs_dir
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(
                f"Maven (`mvn`) is needed once to fetch the Kafka {KAFKA_VERSION} jars into "
                f"{self.libs_dir}; install it (apt-get install maven) and retry."
            )
        self.libs_dir.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="libs.partial-", dir=self.libs_dir.parent))
        try:
            result = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "-f",
                    str(KAFKA_POM),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={scratch}",
                    "-DincludeScope=runtime",
                ],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0 or not any(scratch.glob("kafka_2.13-*.jar")):
                output = (result.stdout + result.stderr).strip().splitlines()
                raise BrokerError(
                    f"mvn could not fetch the Kafka {KAFKA_VERSION} jars (exit {result.returncode}); "
                    f"is Maven Central reachable? Last lines:\n" + "\n".join(output[-20:])
                )
            (scratch / ".complete").write_text(digest + "\n")
            shutil.rmtree(self.libs_dir, ignore_errors=True)
            try:
                scratch.rename(self.libs_dir)
            except OSError:
                # Another process finished first; its copy is as good as ours.
                if not marker.is_file():
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return self.libs_dir

    # -- config and storage ------------------------------------------------

    def server_properties(self) -> dict[str, str]:
        """The broker's settings: single node, loopback only, fast housekeeping for tests."""
        return {
            # KRaft combined mode: one process is the whole cluster. A static voter
            # set (not --standalone's dynamic quorum) means nothing port-related is
            # baked into the formatted storage, so the ports may change later.
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},"
            f"CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.advertised_port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # Internal topics must fit on one broker, or transactions and groups never work.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Fewer internal partitions: the first transaction/group comes up faster.
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.num.partitions": "5",
            "group.initial.rebalance.delay.ms": "0",
            "num.partitions": "3",
            # Topics are created on purpose; a typo must not create a new one.
            "auto.create.topics.enable": "false",
            # Retention runs within about a second, so retention tests are fast.
            "log.initial.task.delay.ms": "1000",
            "log.retention.check.interval.ms": "1000",
            "log.segment.delete.delay.ms": "100",
            **self._sasl_properties(),
        }

    def _sasl_properties(self) -> dict[str, str]:
        if self.sasl_port is None:
            return {}
        sasl = f"SASL_PLAINTEXT://{self.host}:{self.sasl_port}"
        users = " ".join(f'user_{name}="{password}"' for name, password in self.sasl_users.items())
        return {
            "listeners": f"PLAINTEXT://{self.host}:{self.port},{sasl},"
            f"CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.advertised_port},{sasl}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            ),
            **(
                {
                    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                    "super.users": "User:ANONYMOUS",
                }
                if self.acls
                else {}
            ),
        }

    def write_config(self) -> Path:
        """Write server.properties and the log4j2 config; done on every start so edits apply."""
        self.home.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in self.server_properties().items()]
        self.config_path.write_text(
            "# Written by slicewise_dev.broker; edits are overwritten.\n" + "\n".join(lines) + "\n"
        )
        self.log4j_path.write_text(LOG4J2_PROPERTIES)
        return self.config_path

    def is_formatted(self) -> bool:
        """KRaft storage must be formatted once; meta.properties is what the format writes."""
        return (self.data_dir / "meta.properties").is_file()

    def cluster_id(self) -> str | None:
        """The cluster id written at format time, or None before formatting."""
        meta = self.data_dir / "meta.properties"
        if not meta.is_file():
            return None
        for line in meta.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id":
                return value.strip()
        return None

    def format(self) -> bool:
        """Format the storage with Kafka's StorageTool unless already done; True if it ran."""
        if self.is_formatted():
            return False
        self.write_config()
        libs = self.ensure_jars()
        result = subprocess.run(
            [
                *self._java(libs),
                "kafka.tools.StorageTool",
                "format",
                "-t",
                _random_cluster_id(),
                "-c",
                str(self.config_path),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0 or not self.is_formatted():
            raise BrokerError(
                f"Formatting {self.data_dir} failed (exit {result.returncode}):\n"
                + (result.stdout + result.stderr).strip()
            )
        return True

    # -- lifecycle ---------------------------------------------------------

    def pid(self) -> int | None:
        """Pid of our running broker, or None (stale pid files are ignored)."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._alive(pid) else None

    def is_running(self) -> bool:
        """True while the broker process of this state folder is alive (healthy or not)."""
        return self.pid() is not None

    def is_healthy(self, timeout: float = 5.0) -> bool:
        """True if metadata is served by *this* broker and the transaction coordinator works.

        The cluster id is compared so another broker on the same port never passes
        for ours; init_transactions() proves the single-broker transaction setup.
        """
        if not port_open(self.port, self.host):
            return False
        deadline = time.monotonic() + timeout
        conf = {"bootstrap.servers": self.bootstrap, "log_level": 2}
        try:
            expected = self.cluster_id()
            if expected is None:
                return False  # never formatted, so whatever answers there is not ours
            metadata = AdminClient(conf).list_topics(timeout=timeout)
            if metadata.cluster_id != expected:
                return False
            producer = Producer({**conf, "transactional.id": HEALTHCHECK_TRANSACTIONAL_ID})
            try:
                producer.init_transactions(max(0.5, deadline - time.monotonic()))
            finally:
                producer.close()
        except KafkaException:
            return False
        return True

    def start(self, timeout: float = 60.0) -> bool:
        """Start the broker and wait until it is healthy; False if it was already up.

        Raises BrokerError (with the tail of server.log) if it does not come up in time.
        """
        deadline = time.monotonic() + timeout
        if self.is_running():
            # Up already, or still starting from another caller: just wait for it.
            self._wait_healthy(deadline)
            return False
        for port in (self.port, self.controller_port, self.sasl_port):
            if port is None:
                continue
            if not _port_free(port, self.host):
                raise BrokerError(
                    f"Port {port} on {self.host} is taken by another process (another broker with a "
                    f"different state dir?); stop it or choose other ports."
                )
        self.write_config()
        libs = self.ensure_jars()
        self.format()
        self.pid_path.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            log.write(
                f"\n==== slicewise: starting Kafka {KAFKA_VERSION} at {time.ctime()} ====\n".encode()
            )
            log.flush()
            self._proc = subprocess.Popen(
                [*self._java(libs), "kafka.Kafka", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,  # outlives us and ignores our Ctrl-C
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        try:
            self._wait_healthy(deadline)
        except BrokerError:
            self.stop()
            raise
        return True

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM (clean shutdown), then SIGKILL after `timeout`; False if it was not running."""
        pid = self.pid()
        if pid is None:
            self.pid_path.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not self._wait_exit(pid, 10.0):
                raise BrokerError(f"Kafka broker pid {pid} survived SIGKILL")
        self.pid_path.unlink(missing_ok=True)
        self._proc = None
        return True

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of server.log, for error messages."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 64 * 1024))
                text = log.read().decode(errors="replace")
        except OSError:
            return "(no server.log yet)"
        return "\n".join(text.splitlines()[-lines:])

    # -- internals ---------------------------------------------------------

    def _java(self, libs: Path) -> list[str]:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if not java or not Path(java).exists():
            raise BrokerError(
                "Java 17+ is needed to run Kafka; install it (apt-get install openjdk-17-jre-headless)."
            )
        return [
            java,
            "-Xmx512m",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_path}",
            "-cp",
            f"{libs}/*",
        ]

    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        proc = Path(f"/proc/{pid}")
        if not proc.exists():
            return True  # no procfs (macOS): trust kill(0)
        try:
            if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False  # exited, not yet reaped
            cmdline = proc.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        # Guard against pid reuse: it must be kafka.Kafka with our config.
        return b"kafka.Kafka" in cmdline and str(self.config_path).encode() in cmdline

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=0.2)
            if not self._alive(pid):
                return True
            time.sleep(0.1)
        return not self._alive(pid)

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            pid = self.pid()
            if pid is None:
                code = self._proc.poll() if self._proc is not None else None
                raise BrokerError(
                    f"Kafka broker exited during startup (exit code {code}); "
                    f"{self.log_path} ends with:\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if self.is_healthy(timeout=max(1.0, min(5.0, remaining))):
                return
            if time.monotonic() >= deadline:
                raise BrokerError(
                    f"Kafka broker (pid {pid}) not healthy at {self.bootstrap} in time; "
                    f"{self.log_path} ends with:\n{self.log_tail()}"
                )
            time.sleep(0.2)


def _random_cluster_id() -> str:
    """A Kafka Uuid string (url-safe base64 of 16 random bytes), as `StorageTool random-uuid` prints."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # Kafka avoids ids that look like command-line flags
            return text


@contextlib.contextmanager
def running_broker(state_dir: Path, **options: Any) -> Iterator[LocalBroker]:
    """A broker of one's own for the with-block: started, then stopped after it.

    It listens on free loopback ports, so it never meets (or passes for) the demo's
    broker on 19092; a caller that needs to know a port first (to put a proxy in
    front) picks `port` and `controller_port` itself with one `free_ports` call.
    `options` are LocalBroker's (sasl_users, advertised_port, ...).
    """
    wanted = [k for k in ("port", "controller_port") if k not in options]
    if options.get("sasl_users") and "sasl_port" not in options:
        wanted.append("sasl_port")
    options.update(zip(wanted, free_ports(len(wanted)), strict=True))
    broker = LocalBroker(state_dir, load_settings().cache_dir, **options)
    broker.start(timeout=120)  # a first run also downloads the jars
    try:
        yield broker
    finally:
        broker.stop()


def free_ports(count: int = 2) -> list[int]:
    """Distinct loopback ports nothing listens on now, so a test broker never meets the demo's.

    Drawn at random below the kernel's ephemeral range: a port the kernel hands out
    (`bind(0)`) may meanwhile become some client's outgoing port, and a service started on it
    a second later fails with "address in use" (it did, in CI).
    """
    low = _ephemeral_low() - 1
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(10_000, low)
        if port not in ports and _port_free(port):
            ports.append(port)
    return ports


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nothing listens there; SO_REUSEADDR ignores TIME_WAIT left by a stopped broker."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    settings = load_settings()
    parser = argparse.ArgumentParser(
        prog="python -m slicewise_dev.broker", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "command",
        choices=["start", "stop", "status", "jars"],
        help="jars: fetch the Kafka jars if needed and print their folder",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=settings.state_dir,
        help="broker data, config and log go under STATE_DIR/kafka (default: %(default)s)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=settings.cache_dir,
        help="jars are cached under CACHE_DIR/kafka-<version> (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for start/stop"
    )
    args = parser.parse_args(argv)
    broker = LocalBroker(args.state_dir, args.cache_dir)
    where = f"(state: {broker.home})"
    try:
        if args.command == "jars":
            print(broker.ensure_jars())
        elif args.command == "start":
            began = time.monotonic()
            if broker.start(timeout=args.timeout):
                print(
                    f"Kafka broker up at {broker.bootstrap} in {time.monotonic() - began:.1f}s "
                    f"(pid {broker.pid()}) {where}"
                )
            else:
                print(
                    f"Kafka broker already running at {broker.bootstrap} (pid {broker.pid()}) {where}"
                )
        elif args.command == "stop":
            pid = broker.pid()
            if broker.stop(timeout=args.timeout):
                print(f"Kafka broker stopped (was pid {pid}) {where}")
            else:
                print(f"Kafka broker was not running {where}")
        else:
            pid = broker.pid()
            if pid is None:
                print(f"Kafka broker not running {where}")
                return 1
            health = "healthy" if broker.is_healthy() else "NOT healthy (see server.log)"
            print(f"Kafka broker running at {broker.bootstrap} (pid {pid}), {health} {where}")
            return 0 if health == "healthy" else 2
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
