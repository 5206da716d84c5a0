"""The Airflow operators of a slice step, and Kafka settings from an Airflow connection.

Two ways to run a Spark step, chosen by SLICEWISE_SPARK_MODE (see config.spark_mode):

* `SliceSparkConnectOperator` (default): the task is a client session of a long-lived
  Spark Connect server named by a `spark_connect` connection (the Spark provider's
  `PySparkOperator`); the step's code runs in the task, its Spark work on the server.
* `SliceSparkSubmitOperator`: one `spark-submit` application per step, for teams that
  must run one application per task (YARN, Kubernetes).

Set SLICEWISE_KAFKA_CONN_ID to the id of a connection (host = bootstrap servers,
login/password = SASL credentials, extra = librdkafka properties; see
`slicewise.kafka.security.env_from_connection`). It is read when a task runs,
never while the DAG is parsed, and reaches Spark as environment variables or
settings, not as templates, so credentials never show among a task's rendered fields.
SLICEWISE_AWS_CONN_ID does the same for the object store of the lakehouse and ledger,
and SLICEWISE_SCHEMA_REGISTRY_CONN_ID for an Avro pipeline's schema registry.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync

KAFKA_CONN_ID_ENV = "SLICEWISE_KAFKA_CONN_ID"
AWS_CONN_ID_ENV = "SLICEWISE_AWS_CONN_ID"
REGISTRY_CONN_ID_ENV = "SLICEWISE_SCHEMA_REGISTRY_CONN_ID"
log = logging.getLogger(__name__)


def kafka_connection_env() -> dict[str, str]:
    """SLICEWISE_KAFKA_* variables from the configured connection; {} when none is set."""
    conn_id = os.environ.get(KAFKA_CONN_ID_ENV, "").strip()
    if not conn_id:
        return {}
    from airflow.sdk import BaseHook

    from slicewise.kafka.security import env_from_connection

    return env_from_connection(BaseHook.get_connection(conn_id))


def store_connection_env() -> dict[str, str]:
    """AWS_* variables from the connection named by SLICEWISE_AWS_CONN_ID (an Amazon
    provider `aws` connection: login = access key id, password = secret access key,
    extra `region_name`, `endpoint_url`, `aws_session_token`); {} when none is set."""
    conn_id = os.environ.get(AWS_CONN_ID_ENV, "").strip()
    if not conn_id:
        return {}
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    extra = dict(conn.extra_dejson or {})
    env = {
        "AWS_ACCESS_KEY_ID": conn.login,
        "AWS_SECRET_ACCESS_KEY": conn.password,
        "AWS_SESSION_TOKEN": extra.get("aws_session_token"),
        "AWS_REGION": extra.get("region_name"),
        "AWS_ENDPOINT_URL": extra.get("endpoint_url"),
    }
    if str(extra.get("endpoint_url", "")).startswith("http://"):
        env["AWS_ALLOW_HTTP"] = "true"
    return {name: str(value) for name, value in env.items() if value}


def registry_connection_env() -> dict[str, str]:
    """SLICEWISE_SCHEMA_REGISTRY_* from the connection named by
    SLICEWISE_SCHEMA_REGISTRY_CONN_ID (an `http` connection: host, or a whole URL in
    host; schema `https` or `http`; port; extra `path`, e.g. /apis/ccompat/v7 for
    Apicurio; login and password when the registry asks); {} when none is set."""
    conn_id = os.environ.get(REGISTRY_CONN_ID_ENV, "").strip()
    if not conn_id:
        return {}
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    host = conn.host or ""
    url = host if "://" in host else f"{conn.schema or 'http'}://{host}"
    if conn.port and "://" not in host:
        url += f":{conn.port}"
    url = url.rstrip("/") + str(dict(conn.extra_dejson or {}).get("path", ""))
    env = {
        "SLICEWISE_SCHEMA_REGISTRY_URL": url,
        "SLICEWISE_SCHEMA_REGISTRY_USER": conn.login,
        "SLICEWISE_SCHEMA_REGISTRY_PASSWORD": conn.password,
    }
    return {name: str(value) for name, value in env.items() if value}


def connections_env() -> dict[str, str]:
    """What the configured Airflow connections set: Kafka's and the schema registry's."""
    return {**kafka_connection_env(), **registry_connection_env()}


def task_settings(pipeline: str | None = None):
    """Settings of a pipeline for code running in an Airflow task: environment, then the
    Kafka and schema-registry connections; and the object store's connection, if one is
    named, in the process environment, where the ledger's store client reads
    credentials (they are never logged or rendered)."""
    from slicewise.config import load_settings

    os.environ.update(store_connection_env())
    return load_settings({**os.environ, **connections_env()}, pipeline=pipeline)


def step_lineage(step: str, argv: list[str]) -> Any:
    """What a finished step read and wrote, for Airflow's OpenLineage provider."""
    from slicewise.jobs import step_parser
    from slicewise.lineage import step_lineage as lineage

    args = step_parser(step).parse_args(argv)
    return lineage(task_settings(args.pipeline), step, args.slice_id)


def application(step: str) -> str:
    """The spark-submit application of a step, `spark_jobs/<step>.py`, wherever the package
    is installed: it ships them as `slicewise.spark_jobs`, so a DAG file copied into any
    DAGs folder finds them."""
    from slicewise import spark_jobs

    return os.path.join(os.path.dirname(spark_jobs.__file__), f"{step}.py")


class SliceSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit of one slice step, with the connections' settings in its environment."""

    def execute(self, context: Any) -> None:
        self.env_vars = {**(self.env_vars or {}), **connections_env()}
        super().execute(context)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return step_lineage(self.task_id, list(self.application_args))


class IntervalClosedSensor(DateTimeSensorAsync):
    """Waits, deferred (no worker slot held), until the interval's end plus grace.

    When that moment has already passed (a backfill, a catch-up run, a cleared task) it
    succeeds at once instead of a round trip through the triggerer, which costs seconds
    per run for nothing.
    """

    def execute(self, context: Any) -> None:
        from datetime import datetime, timezone

        if datetime.now(timezone.utc) >= self._moment:
            return
        super().execute(context)


def run_step(step: str, argv: list[str], spark: Any = None) -> Any:
    """The body of a Spark Connect step: the same entry point as spark-submit's."""
    from slicewise.jobs import run, step_parser

    args = step_parser(step).parse_args(argv)
    return run(step, args, spark=spark, settings=task_settings(args.pipeline))


class SliceSparkConnectOperator(PySparkOperator):
    """One slice step as a client session of the Spark Connect server of `conn_id`.

    The provider opens the session from the connection (`spark_connect`: the embedded
    server, a remote one and a Kubernetes-hosted one differ only by it) and stops it
    afterwards. When Airflow kills the task, `on_kill` interrupts the step's server-side
    operations and releases the session, so the server drops its cached slice at once.
    What a kill cannot stop (SIGKILL of the worker, a commit already in flight) is
    fenced like a zombie driver: each write carries the step's Delta idempotent-write
    id, so a late commit and the retry's cannot both land.
    """

    def __init__(self, *, step: str, argv: list[str], conn_id: str, **kwargs: Any) -> None:
        super().__init__(
            python_callable=run_step,
            conn_id=conn_id,
            op_kwargs={"step": step, "argv": argv},
            **kwargs,
        )
        self.step = step

    def execute_callable(self) -> Any:
        """Open a session of our own (not the process's default one, which a test or
        another task may hold) and stop it afterwards; fail fast, naming the
        connection, when the server is down: the Connect client would otherwise
        retry for minutes."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from slicewise.spark import SparkUnauthorized, SparkUnavailable, remote_session

        url = SparkConnectHook(self.conn_id).get_connection_url()
        try:
            self._session = remote_session(url, f"{self.dag_id}-{self.task_id}", fresh=True)
        except (SparkUnavailable, SparkUnauthorized) as exc:
            raise type(exc)(f"connection {self.conn_id!r}: {exc}") from None
        try:
            self.op_kwargs = {**self.op_kwargs, "spark": self._session}
            # PythonOperator's call, past PySparkOperator's own session handling.
            return super(PySparkOperator, self).execute_callable()
        finally:
            self._session.stop()
            self._session = None

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return step_lineage(self.step, list(self.op_kwargs["argv"]))

    def on_kill(self) -> None:
        session = getattr(self, "_session", None)
        if session is None:
            return
        try:
            interrupted = session.interruptAll()
            log.warning("task killed: interrupted %d server operation(s)", len(interrupted))
        finally:
            session.stop()
