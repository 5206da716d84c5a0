"""Twelve-factor settings: environment variables with defaults that make the
embedded mode (local broker, Spark local[*], lakehouse under .state/) work with
no configuration at all. Paths default under the deployment's home (`slicewise.home`),
never into the installed package.

Wrong values fail fast with a `ConfigError` naming the variable and what to set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from pathlib import Path

from slicewise.connect_auth import HIDDEN, configured_token, redacted
from slicewise.errors import ConfigError
from slicewise.home import default_state_dir
from slicewise.kafka.security import KAFKA_PROP_PREFIX, KAFKA_SPARK_PROP_PREFIX, java_props
from slicewise.pipelines import (
    Pipeline,
    as_cron,
    as_span,
    definitions_file,
    load_pipelines,
    pipeline_named,
)
from slicewise.schema_registry import SchemaRegistry

LOCAL_BOOTSTRAP = "127.0.0.1:19092"


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str
    topic: str
    lakehouse: str
    state_dir: Path
    cache_dir: Path
    grace_seconds: int
    max_value_bytes: int
    # The declared pipeline these settings run (pipelines.yaml): key, schema, event time.
    pipeline: Pipeline
    # Client properties, which may hold a SASL password or a JAAS config: a repr shows
    # their keys, never their values (`__repr__`).
    kafka_props: Mapping[str, str] = field(default_factory=dict)
    kafka_spark_props: Mapping[str, str] = field(default_factory=dict)
    # The ledgers' root (SLICEWISE_LEDGER_DIR), each pipeline's in a folder of its own under
    # it; None: beside the tables. A POSIX path when the tables are on an object store.
    ledger_location: str | None = None
    # The other pipelines of the definition file reading this one's topic.
    topic_shared_with: tuple[str, ...] = ()
    # sc://host:port of a Spark Connect server the steps are clients of; None: in-process Spark.
    spark_remote: str | None = None
    # The token its clients send (connect_auth); never in a repr, so never in a log.
    spark_token: str | None = field(default=None, repr=False)
    # How long an open transaction may hold a partition's LSO before planning fails; 0: never.
    max_open_transaction_seconds: int = 900
    # How long publication waits for the gates of slices merged before it (`publish`).
    publish_wait_seconds: int = 600
    # Most records one Spark task reads of a slice (the Kafka source's
    # maxRecordsPerPartition); 0: one task per Kafka partition, Spark's default.
    records_per_task: int = 50_000
    # Longest a Spark step attempt may run before Airflow stops it (SLICEWISE_STEP_TIMEOUT):
    # no attempt holds a table snapshot longer, so VACUUM may delete what it removed before.
    step_timeout: timedelta = timedelta(hours=2)
    # An Avro pipeline's schema registry (SLICEWISE_SCHEMA_REGISTRY_*); its credentials
    # are never in a repr, so never in a log.
    schema_registry: SchemaRegistry | None = None

    def __repr__(self) -> str:
        """The dataclass's repr with the secrets hidden, so a logged or printed Settings
        leaks none: the Kafka properties' values (their keys stay, to show what is set)
        and a `;token=` in the Spark Connect URL. The token and the registry's
        credentials are left out by their fields."""
        shown = []
        for f in fields(self):
            if not f.repr:
                continue
            value = getattr(self, f.name)
            if f.name in ("kafka_props", "kafka_spark_props"):
                value = dict.fromkeys(value, HIDDEN)
            elif f.name == "spark_remote" and value:
                value = redacted(value)
            shown.append(f"{f.name}={value!r}")
        return f"{type(self).__qualname__}({', '.join(shown)})"

    @property
    def spark_kafka_props(self) -> dict[str, str]:
        """The Java client's properties for Spark's Kafka source."""
        return java_props(self.kafka_props, self.kafka_spark_props)

    @property
    def schema_subject(self) -> str:
        """An Avro pipeline's registry subject: the topic name strategy's by default."""
        chosen = self.pipeline.schema_registry.subject if self.pipeline.schema_registry else None
        return chosen or f"{self.topic}-value"

    @property
    def dedup_horizon_days(self) -> int:
        return self.pipeline.horizon_days

    def table(self, name: str) -> str:
        """Location of one of the pipeline's tables (bronze, silver, quarantine, gold, ...):
        each pipeline has a folder of its own under the lakehouse."""
        return f"{self.lakehouse.rstrip('/')}/{self.pipeline.tables_folder}/{name}"

    @property
    def ledger_dir(self) -> str:
        """Where the pipeline's ledger lives (the `Ledger` is its `<topic>/` folder): beside
        its tables, or under SLICEWISE_LEDGER_DIR in its tables' folder name, so two
        pipelines on one topic never share gate records or retention. `Ledger.of` opens
        it (and finds one an earlier version kept per topic)."""
        if self.ledger_location is None:
            return self.table("_ledger")
        return f"{self.ledger_location.rstrip('/')}/{self.pipeline.tables_folder}"

    @property
    def data_docs_dir(self) -> Path:
        return self.state_dir / "data_docs" / self.pipeline.name


def schema_registry(env: Mapping[str, str], definition: Pipeline) -> SchemaRegistry | None:
    """The registry an Avro pipeline reads its schemas from; None for a JSON pipeline."""
    url = env.get("SLICEWISE_SCHEMA_REGISTRY_URL", "").strip()
    if definition.format == "json":
        return None
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"pipeline {definition.name!r} reads {definition.format}: set "
            "SLICEWISE_SCHEMA_REGISTRY_URL to its schema registry's API root "
            "(http[s]://host:port, Confluent-compatible), and SLICEWISE_SCHEMA_REGISTRY_USER "
            "and SLICEWISE_SCHEMA_REGISTRY_PASSWORD if it asks for credentials."
        )
    return SchemaRegistry(
        url,
        user=env.get("SLICEWISE_SCHEMA_REGISTRY_USER") or None,
        password=env.get("SLICEWISE_SCHEMA_REGISTRY_PASSWORD") or None,
    )


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(
            f"{name}={raw!r} is not an integer; set it to a whole number (default {default})."
        ) from None
    if value < minimum:
        raise ConfigError(
            f"{name}={value} is below {minimum}; set it to {minimum} or more (default {default})."
        )
    return value


def kafka_props_from_env(env: Mapping[str, str], prefix: str = KAFKA_PROP_PREFIX) -> dict[str, str]:
    return {
        key[len(prefix) :].lower().replace("_", "."): value
        for key, value in env.items()
        if key.startswith(prefix)
    }


def _spark_remote(env: Mapping[str, str]) -> str | None:
    remote = env.get("SLICEWISE_SPARK_REMOTE", "").strip()
    if remote and not remote.startswith("sc://"):
        raise ConfigError(
            f"SLICEWISE_SPARK_REMOTE={remote!r} is not a Spark Connect URL; use sc://host:port "
            "(e.g. sc://127.0.0.1:15002), or unset it to run Spark in-process."
        )
    return remote or None


SPARK_MODES = ("connect", "submit")


def spark_mode(env: Mapping[str, str] | None = None) -> str:
    """How the DAG runs its Spark steps: `connect` (clients of a long-lived Spark Connect
    server, the default) or `submit` (one spark-submit application per step).

    Read while the DAG is parsed, so it only looks at the environment.
    """
    env = os.environ if env is None else env
    mode = env.get("SLICEWISE_SPARK_MODE", "").strip().lower() or "connect"
    if mode not in SPARK_MODES:
        raise ConfigError(
            f"SLICEWISE_SPARK_MODE={mode!r} is not one of {', '.join(SPARK_MODES)}; "
            "use connect (steps on a Spark Connect server) or submit (spark-submit per step)."
        )
    return mode


def grace_seconds(env: Mapping[str, str] | None = None) -> int:
    """The grace after an interval's end before its boundary is frozen (read at DAG parse)."""
    return _int(os.environ if env is None else env, "SLICEWISE_GRACE_SECONDS", 30)


def schedule(env: Mapping[str, str] | None = None) -> str:
    """The default cron of the pipelines' DAGs (one data interval, one slice; read at DAG
    parse): SLICEWISE_SCHEDULE, cron or a duration such as 5m, else hourly. A pipeline's
    `schedule:` overrides it."""
    env = os.environ if env is None else env
    text = env.get("SLICEWISE_SCHEDULE", "").strip()
    if not text:
        return "0 * * * *"
    try:
        return as_cron(text)
    except ValueError as exc:
        raise ConfigError(f"SLICEWISE_SCHEDULE: {exc}") from None


def step_timeout(env: Mapping[str, str] | None = None) -> timedelta:
    """How long one attempt of a Spark step may run (read at DAG parse): SLICEWISE_STEP_TIMEOUT,
    a duration such as 90m or 2h; 2 h by default. Maintenance's VACUUM never deletes a file
    removed more recently than this, so no running attempt loses a file it reads."""
    env = os.environ if env is None else env
    text = env.get("SLICEWISE_STEP_TIMEOUT", "").strip() or "2h"
    try:
        span = as_span(text, "SLICEWISE_STEP_TIMEOUT")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if span < timedelta(seconds=1):
        raise ConfigError(f"SLICEWISE_STEP_TIMEOUT={text!r}: set at least 1s (default 2h)")
    return span


def state_folder(env: Mapping[str, str]) -> Path:
    return Path(env.get("SLICEWISE_STATE_DIR") or default_state_dir(env)).expanduser()


def load_settings(env: Mapping[str, str] | None = None, pipeline: str | None = None) -> Settings:
    """Read settings from the environment (or the given mapping) and validate them, for
    the named pipeline (else SLICEWISE_PIPELINE, else the definition file's first)."""
    env = os.environ if env is None else env
    definition = pipeline_named(
        pipeline or env.get("SLICEWISE_PIPELINE", "").strip() or None, definitions_file(env)
    )
    state_dir = state_folder(env)
    cache_dir = Path(
        env.get("SLICEWISE_CACHE_DIR") or Path.home() / ".cache" / "slicewise"
    ).expanduser()
    # The definition names the topic; SLICEWISE_TOPIC overrides it for one deployment
    # (a staging cluster's topic name, a test's own topic).
    topic = env.get("SLICEWISE_TOPIC", definition.topic).strip()
    if "SLICEWISE_TOPIC" in env and len(load_pipelines(definitions_file(env))) > 1:
        raise ConfigError(
            f"SLICEWISE_TOPIC={env['SLICEWISE_TOPIC']!r} would send every pipeline of "
            f"{definitions_file(env)} to one topic; unset it and set each pipeline's `topic:` "
            "in the file (SLICEWISE_TOPIC is for a file with one pipeline)."
        )
    if not topic:
        raise ConfigError(
            f"SLICEWISE_TOPIC is blank; unset it to ingest {definition.topic!r} (the topic of "
            f"pipeline {definition.name!r}) or set it to a topic name."
        )
    bootstrap = env.get("SLICEWISE_KAFKA_BOOTSTRAP", "").strip() or LOCAL_BOOTSTRAP
    if ":" not in bootstrap:
        raise ConfigError(
            f"SLICEWISE_KAFKA_BOOTSTRAP={bootstrap!r} has no port; use host:port[,host:port], "
            f"or unset it to use the embedded broker at {LOCAL_BOOTSTRAP}."
        )
    lakehouse = env.get("SLICEWISE_LAKEHOUSE", "").strip() or str(state_dir / "lakehouse")
    if spark_mode(env) == "submit" and lakehouse.startswith(("s3a://", "s3://")):
        raise ConfigError(
            f"SLICEWISE_SPARK_MODE=submit with SLICEWISE_LAKEHOUSE={lakehouse}: every "
            "spark-submit is a Delta writer of its own, and Delta's default S3 log store is "
            "safe with one writing driver only (two attempts of a step could both commit). "
            "Use SLICEWISE_SPARK_MODE=connect, where one Spark Connect server writes for every "
            "task, or a lakehouse on GCS, ADLS or HDFS (docs/DEPLOYING.md#object-storage)."
        )
    settings = Settings(
        bootstrap_servers=bootstrap,
        topic=topic,
        lakehouse=lakehouse,
        state_dir=state_dir,
        cache_dir=cache_dir,
        grace_seconds=grace_seconds(env),
        max_value_bytes=_int(env, "SLICEWISE_MAX_VALUE_BYTES", 1_048_576, minimum=1),
        pipeline=definition,
        kafka_props=kafka_props_from_env(env),
        kafka_spark_props=kafka_props_from_env(env, KAFKA_SPARK_PROP_PREFIX),
        ledger_location=env.get("SLICEWISE_LEDGER_DIR", "").strip() or None,
        topic_shared_with=tuple(
            sorted(
                n
                for n, p in load_pipelines(definitions_file(env)).items()
                if p.topic == definition.topic and n != definition.name
            )
        ),
        spark_remote=_spark_remote(env),
        spark_token=configured_token(env, state_dir),
        max_open_transaction_seconds=_int(env, "SLICEWISE_MAX_OPEN_TRANSACTION_SECONDS", 900),
        publish_wait_seconds=_int(env, "SLICEWISE_PUBLISH_WAIT_SECONDS", 600),
        records_per_task=_int(env, "SLICEWISE_RECORDS_PER_TASK", 50_000),
        step_timeout=step_timeout(env),
        schema_registry=schema_registry(env, definition),
    )
    settings.spark_kafka_props  # noqa: B018 - fail fast on settings Spark could not use
    return settings
