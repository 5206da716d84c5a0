"""The one place that builds a SparkSession.

Jobs, tests and `spark-submit` (through the Airflow operator) all take their
jars and Delta settings from here, so the classpath never drifts apart. The jar
coordinates themselves are pinned in the package's `spark-jars.pom.xml`; a Spark
Connect server of a team's own takes them as `--packages` (`spark_packages`,
`slicewise spark-server`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import socket
import subprocess
import time
import zipfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from xml.etree import ElementTree

from slicewise.class_archive import ClassArchive, write_archive
from slicewise.config import ConfigError, Settings, load_settings, state_folder
from slicewise.connect_auth import TOKEN_ENV, authorized_url, configured_token, redacted

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Prepended to spark.driver.extraJavaOptions, which stays a deployment's own.
DEFAULT_JAVA_OPTIONS = "spark.driver.defaultJavaOptions"
SPARK_POM = Path(__file__).with_name("spark-jars.pom.xml")  # package data, not the checkout
MAVEN = "{http://maven.apache.org/POM/4.0.0}"


def spark_packages(pom: Path = SPARK_POM) -> list[str]:
    """The pom's dependencies as Maven coordinates (`group:artifact:version`), what
    Spark's own `--packages` (`spark.jars.packages`) resolves through Ivy: a server
    started the way Spark documents it needs nothing else of ours."""
    root = ElementTree.parse(pom).getroot()
    properties = {el.tag.removeprefix(MAVEN): el.text for el in root.find(f"{MAVEN}properties")}

    def value(dependency: ElementTree.Element, tag: str) -> str:
        text = dependency.find(f"{MAVEN}{tag}").text.strip()
        return re.sub(r"\$\{([^}]+)\}", lambda m: properties[m.group(1)], text)

    return [
        ":".join(value(d, t) for t in ("groupId", "artifactId", "version"))
        for d in root.iter(f"{MAVEN}dependency")
        if d.find(f"{MAVEN}version") is not None
    ]


def spark_jars(settings: Settings | None = None) -> list[Path]:
    """Jars for Delta and the Kafka connector, copied from Maven Central once.

    The cache folder is keyed by the pom's hash, so changing a version in the
    pom resolves again instead of mixing old and new jars.
    """
    settings = settings or load_settings()
    digest = hashlib.sha256(SPARK_POM.read_bytes()).hexdigest()[:12]
    target = settings.cache_dir / f"spark-jars-{digest}"
    marker = target / ".complete"
    if not marker.exists():
        if shutil.which("mvn") is None:
            raise ConfigError(
                "Maven (`mvn`) is needed once to fetch the Spark jars; install it (apt-get install maven)."
            )
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run(
            [
                "mvn",
                "-q",
                "-Dstyle.color=never",
                "-B",
                "-f",
                str(SPARK_POM),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={partial}",
                "-DincludeScope=runtime",
            ],
            check=True,
        )
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        marker.touch()
    return sorted(target.glob("*.jar"))


def jars_arg(settings: Settings | None = None) -> str:
    return ",".join(str(jar) for jar in spark_jars(settings))


def package_zip(settings: Settings | None = None) -> Path:
    """The `slicewise` package as a zip for `--py-files`, so executors on any cluster
    import the same code as the driver. Named by its content's hash: built once per
    change, and a job that is running keeps the zip it started with.
    """
    settings = settings or load_settings()
    package = Path(__file__).resolve().parent
    sources = sorted(package.rglob("*.py"))
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    target = settings.cache_dir / "py-files" / f"slicewise-{digest.hexdigest()[:12]}.zip"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sources:
                zf.write(path, (Path("slicewise") / path.relative_to(package)).as_posix())
        partial.replace(target)  # atomic: concurrent tasks never see half a zip
    return target


def spark_conf(settings: Settings | None = None) -> dict[str, str]:
    """Spark settings every session of ours needs; also handed to `spark-submit`."""
    return {"spark.jars": jars_arg(settings), **static_conf(), **object_store_conf()}


def object_store_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """s3a's endpoint and region from the variables AWS SDKs read (`AWS_ENDPOINT_URL`,
    `AWS_ENDPOINT_URL_S3`, `AWS_REGION`), so Spark and the ledger find the same store.
    Credentials are not here: see `object_store_secrets`."""
    env = os.environ if env is None else env
    conf = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:  # an S3-compatible server (MinIO, s3proxy, Ceph): bucket in the path
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https"))
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf


def object_store_secrets(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Static S3 credentials from the environment, for a driver whose executors do not
    share its environment (a cluster). Spark redacts these keys in its UI and logs
    (`spark.redaction.regex`); we hand them over in a file, never on a command line.
    Empty with instance roles or web identity: s3a's default chain finds those itself."""
    env = os.environ if env is None else env
    keys = {
        "AWS_ACCESS_KEY_ID": "spark.hadoop.fs.s3a.access.key",
        "AWS_SECRET_ACCESS_KEY": "spark.hadoop.fs.s3a.secret.key",
        "AWS_SESSION_TOKEN": "spark.hadoop.fs.s3a.session.token",
    }
    return {conf: env[var] for var, conf in keys.items() if env.get(var)}


# What the steps rely on that a client sets on its own session (`remote_session`), so a
# Connect server started any way serves them.
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # Delta re-reads a table's whole state after every commit, to verify its checksum,
    # whenever the driver's JVM or host zone is not UTC (a check aimed at pre-1883
    # timestamps in partition values; ours are dates). Our sessions are UTC: a driver on
    # a host elsewhere commits as one on UTC does (docs/DESIGN_CHOICES.md, *Small jobs*).
    "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled": "false",
}


def static_conf() -> dict[str, str]:
    """The settings that need no jar lookup (safe to build while a DAG is parsed)."""
    return {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        **SESSION_CONF,
        "spark.ui.showConsoleProgress": "false",
        # Silver caches a slice's parse for the two reads it needs (quarantine, survivors)
        # and drops it at the step's end: compressing that short-lived cache cost more
        # CPU than it saved (on 500,000 records, the parse and its cache took 3-6 s
        # uncompressed against 4.5-11 s compressed).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # A slice compiles ~240 generated classes (its queries, Delta's commits, the
        # gate's); Spark's cache keeps 100, so each slice evicted what the next one
        # needed and compiled everything again. With room for the working set a warm
        # driver compiles ~6 a slice (bench/results/NOTES.md, 2026-12-05, later).
        "spark.sql.codegen.cache.maxEntries": "1000",
    }


def local_conf() -> dict[str, str]:
    """Small and quiet: for the shared test session and embedded-mode runs."""
    return {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.driver.memory": "2g",
    }


class SparkUnavailable(ConfigError):
    """The configured Spark Connect server does not answer; nothing was written."""


class SparkUnauthorized(ConfigError):
    """The Spark Connect server refused the client's token; nothing was written."""


def remote_session(
    url: str,
    app_name: str = "slicewise",
    wait: float = 5.0,
    fresh: bool = False,
    token: str | None = None,
) -> SparkSession:
    """A client session of the Spark Connect server at `url`, sending its token (the
    URL's own, else `token`, else the deployment's: connect_auth), or a fast, clear
    failure.

    The Connect client retries an unreachable server for minutes before it gives up;
    a task should instead fail at once, naming the server and the safe action. A
    refused token fails as fast, naming the settings that hold it.
    """
    from urllib.parse import urlparse

    from pyspark.sql import SparkSession

    if token is None:
        token = configured_token(os.environ, state_folder(os.environ))
    shown = redacted(url)
    address = urlparse(url.replace("sc://", "http://", 1).split(";")[0])
    host, port = address.hostname or "localhost", address.port or 15002
    deadline = time.monotonic() + wait
    while True:
        try:
            socket.create_connection((host, port), timeout=2).close()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise SparkUnavailable(
                    f"the Spark Connect server {shown} is not reachable ({exc}). Nothing was "
                    "written. Start it (`make spark-connect`) or fix SLICEWISE_SPARK_REMOTE / "
                    "the spark_connect_default connection, then re-run the step or clear the "
                    "task (docs/RUNBOOK.md#spark-connect-server-down)."
                ) from None
            time.sleep(0.5)
    builder = SparkSession.builder.remote(authorized_url(url, token))
    # fresh: a session of its own, which its owner may stop without ending anyone else's.
    spark = builder.create() if fresh else builder.getOrCreate()
    try:  # the first request: the server checks the token here
        spark.conf.set("spark.app.name", app_name)
    except Exception as exc:
        refusal = re.search(r"(\w[\w ]* authentication token[\w ]*)", str(exc))
        if refusal is None:
            raise
        close_refused(spark)
        raise SparkUnauthorized(
            f"the Spark Connect server {shown} refused this client: {refusal.group(1)}. "
            "Nothing was written. Give the token the server started with: the "
            "spark_connect_default connection's password (Airflow), or "
            f"{TOKEN_ENV} (CLI), or the state folder's spark-connect/token file (our own "
            "server's), then re-run the step or clear the task "
            "(docs/RUNBOOK.md#spark-connect-refuses-the-token)."
        ) from None
    # Per session, not only when our launcher starts the server: event dates and gold's
    # hours are UTC whatever zone a team's own Connect server runs in.
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)
    return spark


def close_refused(spark: SparkSession) -> None:
    """Close a client the server refused without a word to the server: pyspark's own
    goodbyes (release the session; at exit, clear its ML cache) would be refused too,
    and it retries them for minutes, holding the process open."""
    atexit.unregister(spark.client._cleanup_ml_cache)
    spark.release_session_on_close = False
    spark.stop()


# Once a process opens a Spark Connect session, pyspark marks the whole process (and
# so every child it starts) as a Connect client through these variables.
CONNECT_SWITCHES = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")


def classic_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child process that runs its own Spark driver (spark-submit, a server)."""
    return {k: v for k, v in env.items() if k not in CONNECT_SWITCHES}


def is_remote(spark: SparkSession) -> bool:
    """True for a Spark Connect client session (no SparkContext on this side)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def get_spark(
    app_name: str = "slicewise",
    master: str | None = None,
    extra_conf: dict[str, str] | None = None,
    settings: Settings | None = None,
) -> SparkSession:
    """Return the active session, a client session of the configured Spark Connect
    server, or an in-process session with Delta and the Kafka connector.

    Under `spark-submit` the JVM already runs with the same jars and settings
    (see `spark_conf`), so `getOrCreate` returns that session and `master` is
    ignored. With SLICEWISE_SPARK_REMOTE set and no explicit `master`, the session
    is a client of that server, which carries the jars and Delta settings itself.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    settings = settings or load_settings()
    if settings.spark_remote and master is None:
        return remote_session(settings.spark_remote, app_name, token=settings.spark_token)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    conf, extra_conf = spark_conf(settings), extra_conf or {}
    # When this call starts the JVM (not spark-submit's, which runs first), it starts from
    # the class archive when one was written (`slicewise class-archive`).
    starts_jvm = SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ
    if starts_jvm and DEFAULT_JAVA_OPTIONS not in extra_conf:
        archive = ClassArchive.of(settings.cache_dir, spark_jars(settings))
        options = archive.driver_options() if archive else None
        if options:
            conf[DEFAULT_JAVA_OPTIONS] = options
    for key, value in {**conf, **extra_conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def write_class_archive(settings: Settings | None = None) -> tuple[Path, float]:
    """`slicewise class-archive`: record the classes of a driver of ours over a short
    Delta job, for every later in-process driver to start from (class_archive)."""
    settings = replace(settings or load_settings(), spark_remote=None)
    return write_archive(
        settings.cache_dir,
        spark_jars(settings),
        lambda options: get_spark(
            "slicewise-class-archive", extra_conf={DEFAULT_JAVA_OPTIONS: options}, settings=settings
        ),
    )


def size_for_slices(spark: SparkSession) -> None:
    """Shuffle into as many partitions as there are cores, unless the deployment chose.

    A slice is an hour of events, not a day: Spark's default of 200 shuffle
    partitions (and Delta's 50 for state reconstruction) turns each small job into
    hundreds of near-empty tasks. Explicit settings (spark-submit --conf) win.
    """
    if is_remote(spark):
        return  # sized where the server starts: server_conf on local[*], --conf on a cluster
    launched = spark.sparkContext.getConf()
    cores = str(spark.sparkContext.defaultParallelism)
    for key in ("spark.sql.shuffle.partitions", "spark.databricks.delta.snapshotPartitions"):
        if not launched.contains(key):
            spark.conf.set(key, cores)


def ship_package(spark: SparkSession, settings: Settings | None = None) -> None:
    """On a cluster, executors import the driver's `slicewise` from `package_zip`.

    Added to the running context rather than passed as `--py-files`: the driver keeps
    importing its installed package (whose paths point at the repo), and only
    executors, which have nothing else, get the zip. Local mode shares the driver's.
    """
    if not is_remote(spark) and not spark.sparkContext.master.startswith("local"):
        spark.sparkContext.addPyFile(str(package_zip(settings)))
