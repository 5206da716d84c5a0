"""The warm engine: one long-lived Spark Connect server that every step is a client of.

A cold `spark-submit` per step pays a JVM start, Delta's and the Kafka connector's
class loading and the JIT's warm-up every time (about 40 s a step on 2 cores); a
client session of a running server opens in under a second. The server comes from
the pyspark wheel (`SparkConnectServer`), with our jars and Delta's SQL extension,
so the steps reach Delta through SQL (`MERGE INTO`, `DESCRIBE HISTORY`) and writer
options, which plain Spark Connect carries.

    python -m slicewise.connect_server run     # in the foreground until Ctrl-C (make spark-connect)
    python -m slicewise.connect_server start   # in the background (the demo), pid in <state>/spark-connect
    python -m slicewise.connect_server stop

The DAG, the CLI and the tests find it through `SLICEWISE_SPARK_REMOTE`
(`sc://127.0.0.1:15002`) or, in Airflow, the `spark_connect_default` connection. It
serves only clients that send its token (connect_auth).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from slicewise.config import Settings, load_settings, state_folder
from slicewise.connect_auth import server_token, uses_tls
from slicewise.spark import (
    classic_env,
    local_conf,
    object_store_secrets,
    spark_conf,
    spark_packages,
    static_conf,
)

SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002


class ConnectServerError(RuntimeError):
    """The server did not come up; the message carries the end of its log."""


WILDCARDS = ("0.0.0.0", "::")


def reachable_at(bind: str) -> str:
    """The address clients on this host dial for a server listening on `bind`."""
    return "127.0.0.1" if bind in WILDCARDS else bind


def server_conf(
    port: int, master: str, bind: str = "127.0.0.1", driver_host: str | None = None
) -> dict[str, str]:
    """Our session settings plus what a shared, long-lived driver needs. The driver
    listens where the server does (`bind`); executors on other hosts dial it at
    `driver_host` (this host's name or address on their network; `bind` if it is one;
    on a wildcard bind, Spark's own choice: the address this host's name resolves to)."""
    conf = {**spark_conf(), **(local_conf() if master.startswith("local") else {})}
    conf.pop("spark.driver.memory", None)  # given to spark-submit as --driver-memory
    host = driver_host or (None if bind in WILDCARDS else bind)
    return {
        **conf,
        "spark.driver.bindAddress": bind,
        **({"spark.driver.host": host} if host else {}),
        "spark.connect.grpc.binding.address": bind,
        "spark.connect.grpc.binding.port": str(port),
        # A client killed mid-step (its Airflow task killed) leaves its operation running
        # detached; it is interrupted after this long unless a client reattaches. Its
        # commit, if it still lands, is fenced by the step's Delta idempotent-write id.
        "spark.connect.execute.manager.detachedTimeout": "60s",
        # A listener event slower than a second is logged whole, unredacted, and a job's
        # start event carries the driver's settings, the Connect token among them (seen
        # in a CI run on a loaded machine). Spark's redaction covers its UI and event
        # log, not this line.
        "spark.scheduler.listenerbus.logSlowEvent": "false",
        # A client that died without releasing its session (SIGKILL) would keep its
        # cached slice in the server's memory for Spark's default of an hour.
        "spark.connect.session.manager.defaultSessionTimeout": "10min",
    }


def server_command(
    port: int,
    master: str,
    bind: str = "127.0.0.1",
    driver_memory: str = "3g",
    secrets: Path | None = None,
    driver_host: str | None = None,
    extra_conf: dict[str, str] | None = None,
) -> list[str]:
    """`secrets`: a properties file (mode 0600) with settings that must not show on a
    command line, where every local user can read them (the client token, keys).
    `extra_conf`: the deployment's own (fixed driver and block manager ports behind a
    firewall, memory), last so they win."""
    args = [str(SPARK_SUBMIT), "--master", master, "--driver-memory", driver_memory]
    if secrets is not None:
        args += ["--properties-file", str(secrets)]
    conf = {**server_conf(port, master, bind, driver_host), **(extra_conf or {})}
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return [*args, "--class", SERVER_CLASS, "--name", "slicewise-connect", "spark-internal"]


# What Ivy would pull beside our coordinates that we never load: hadoop-aws's 600 MB
# AWS SDK bundle (the pom takes only the s3, transfer manager and sts modules).
UNWANTED_PACKAGES = ("software.amazon.awssdk:bundle",)


def documented_command(port: int = DEFAULT_PORT) -> str:
    """A Spark Connect server started the way Spark documents it, with no slicewise code
    on it: Spark's own `spark-submit` of `SparkConnectServer`, our jars as `--packages`
    (resolved from Maven Central by Spark's Ivy), the settings every session needs
    (Delta's extension and catalog, UTC; the client sets the session ones again per
    session) and the pre-shared token. The token goes into a properties file (mode
    0600, written by the shell's own `printf`, no process of its own), never onto the
    command line, where every local user's `ps` would show it; `--load-spark-defaults`
    keeps the installation's spark-defaults.conf, which a properties file would replace."""
    conf = {**static_conf(), "spark.connect.grpc.binding.port": str(port)}
    secrets = '"${SLICEWISE_SPARK_PROPERTIES:-$HOME/.slicewise-connect.properties}"'
    lines = [
        f"spark-submit --class {SERVER_CLASS} --name slicewise-connect",
        f"--properties-file {secrets} --load-spark-defaults",
        f"--packages {','.join(spark_packages())}",
        f"--exclude-packages {','.join(UNWANTED_PACKAGES)}",
        *(f"--conf {k}={v}" for k, v in conf.items()),
        "spark-internal",
    ]
    write = (
        "(umask 077 && printf 'spark.connect.authenticate.token=%s\\n' "
        f'"$SLICEWISE_SPARK_TOKEN" > {secrets}) &&'
    )
    return write + "\n" + " \\\n  ".join(lines)  # shell lines: the token expands where it starts


def connect_connection(url: str, token: str | None) -> str:
    """The Airflow `spark_connect` connection (as AIRFLOW_CONN_* JSON) for a server URL:
    the token is its password, which the provider's hook sends as `;token=`."""
    import json
    from urllib.parse import urlparse

    address = urlparse(url.replace("sc://", "http://", 1).split(";")[0])
    connection = {"conn_type": "spark_connect", "host": address.hostname, "port": address.port}
    if token:
        connection["password"] = token
    if uses_tls(url):
        connection["extra"] = {"use_ssl": True}
    return json.dumps(connection)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class SparkConnectServer:
    """A Spark Connect server as a child JVM; its log and pid file under `home`."""

    def __init__(
        self,
        home: Path,
        port: int = DEFAULT_PORT,
        master: str = "local[*]",
        bind: str = "127.0.0.1",
        token: str | None = None,
        driver_host: str | None = None,
        extra_conf: dict[str, str] | None = None,
    ) -> None:
        self.home = Path(home)
        self.port = port
        self.master = master
        self.bind = bind  # 0.0.0.0 in a container: the token still guards it (connect_auth)
        self.driver_host = driver_host  # what executors on other hosts dial
        self.extra_conf = dict(extra_conf or {})
        # Every request must carry it; by default the deployment's (SLICEWISE_SPARK_TOKEN)
        # or the state folder's, generated on first use, so its clients find it.
        self.token = token or server_token(os.environ, state_folder(os.environ))
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://{reachable_at(self.bind)}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    @property
    def pid_path(self) -> Path:
        return self.home / "server.pid"

    def _write_secrets(self) -> Path:
        """The client token and the object store's credentials for the executors, in a
        properties file readable by this user only (never on the command line)."""
        secrets = {"spark.connect.authenticate.token": self.token, **object_store_secrets()}
        path = self.home / "secrets.properties"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.writelines(
                f"{key} {value.replace(chr(92), chr(92) * 2)}\n" for key, value in secrets.items()
            )  # a Java properties file: a backslash escapes
        return path

    def start(self, timeout: float = 180.0) -> None:
        """Start the server and wait until it accepts sessions; a no-op if ours runs."""
        if self.running():
            return
        if port_open(self.port, reachable_at(self.bind)):
            raise ConnectServerError(
                f"port {self.port} is taken by another process; stop it or choose another port"
            )
        self.home.mkdir(parents=True, exist_ok=True)
        env = {
            **classic_env(dict(os.environ)),  # the server itself is a classic driver
            "SPARK_HOME": str(_wheel_home()),
            "PYSPARK_PYTHON": sys.executable,
        }
        # Where the driver's UI and block manager listen: the server's address, or
        # Spark's own choice when it listens everywhere (a container).
        if self.bind not in WILDCARDS:
            env["SPARK_LOCAL_IP"] = self.bind
        secrets = self._write_secrets()
        with open(self.log_path, "w") as log:
            self._proc = subprocess.Popen(
                server_command(
                    self.port,
                    self.master,
                    self.bind,
                    secrets=secrets,
                    driver_host=self.driver_host,
                    extra_conf=self.extra_conf,
                ),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends the JVM too
            )
        self.pid_path.write_text(str(self._proc.pid))
        deadline = time.monotonic() + timeout
        while not port_open(self.port, reachable_at(self.bind)):
            if self._proc.poll() is not None:
                raise ConnectServerError(f"Spark Connect server exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ConnectServerError(
                    f"Spark Connect server not listening on {self.port} after {timeout:.0f}s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.5)

    def running(self) -> bool:
        pid = self._pid()
        return pid is not None and _alive(pid) and port_open(self.port, reachable_at(self.bind))

    def stop(self, timeout: float = 30.0) -> None:
        pid = self._pid()
        if pid is not None and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        self.pid_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL, as a crash would (the chaos suite)."""
        pid = self._pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait(timeout=30)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> SparkConnectServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        try:
            return int(self.pid_path.read_text())
        except (FileNotFoundError, ValueError):
            return None


def warm_up(url: str, scratch: Path) -> None:
    """Run what every step runs once (a Delta write, a MERGE, history, a small shuffle) on
    a scratch table, so the first real step does not pay the server's class loading and
    JIT warm-up. A long-lived server is warm anyway; this is for one that just started."""
    from slicewise.spark import remote_session
    from slicewise.tables import delta_ref

    spark = remote_session(url, "slicewise-warm-up", fresh=True)
    try:
        path = str(scratch / "warm-up")
        rows = spark.range(1000).selectExpr("cast(id AS string) AS id", "id % 7 AS k")
        rows.write.format("delta").mode("overwrite").save(path)
        rows.createOrReplaceTempView("warm_up_source")
        spark.sql(
            f"MERGE INTO {delta_ref(path)} AS t USING warm_up_source AS s ON t.id = s.id "
            "WHEN MATCHED AND s.k < t.k THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        ).collect()
        spark.sql(f"DESCRIBE HISTORY {delta_ref(path)} LIMIT 1").collect()
        spark.read.format("delta").load(path).groupBy("k").count().collect()
    finally:
        spark.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child still answers signal 0; it is not serving anyone.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return True


def _wheel_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def embedded(settings: Settings | None = None) -> SparkConnectServer:
    """The server of the demo and `make spark-connect`: state under <state>/spark-connect."""
    settings = settings or load_settings()
    return SparkConnectServer(
        settings.state_dir / "spark-connect",
        DEFAULT_PORT,
        token=server_token(os.environ, settings.state_dir),
    )


def parser() -> argparse.ArgumentParser:
    """`python -m slicewise.connect_server`'s command line."""
    parser = argparse.ArgumentParser(
        prog="python -m slicewise.connect_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("action", choices=["run", "start", "stop"])
    parser.add_argument("--master", default="local[*]", help="the Spark master the server drives")
    parser.add_argument(
        "--bind", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)"
    )
    parser.add_argument(
        "--driver-host",
        help="the name or address executors on other hosts reach the driver at "
        "(spark.driver.host; default: the --bind address; on 0.0.0.0, Spark's choice)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of the deployment's own (e.g. spark.driver.port behind a firewall)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    bad = [c for c in args.conf if "=" not in c]
    if bad:
        parser().error(f"--conf takes KEY=VALUE, not {bad[0]!r}")
    server = embedded()
    server.master, server.bind, server.driver_host = args.master, args.bind, args.driver_host
    server.extra_conf = dict(c.split("=", 1) for c in args.conf)
    if args.action == "stop":
        server.stop()
        print("Spark Connect server stopped")
        return 0
    server.start()
    print(
        f"Spark Connect server on {server.url} (master {server.master}, log {server.log_path});\n"
        f"  export SLICEWISE_SPARK_REMOTE={server.url}",
        flush=True,
    )
    if args.action == "run":
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
