"""One Kafka client configuration, two clients.

The planner and the producers use librdkafka (confluent-kafka); Spark's Kafka
source uses the Java client. Their security settings are spelled differently, so
users write librdkafka's names once (SLICEWISE_KAFKA_PROP_*, or an Airflow
connection: see `env_from_connection`) and `java_props` derives the Java
client's. Java-only settings that have no librdkafka twin (Kerberos, OAuth,
keystores) go in SLICEWISE_KAFKA_SPARK_PROP_* and win over the derived ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slicewise.errors import ConfigError

# Kafka client properties, in librdkafka's names: SLICEWISE_KAFKA_PROP_SASL_MECHANISM=PLAIN
# becomes sasl.mechanism=PLAIN for the Python clients, and Spark's Java client gets the
# equivalent (`java_props`). Java-only extras: SLICEWISE_KAFKA_SPARK_PROP_*.
KAFKA_PROP_PREFIX = "SLICEWISE_KAFKA_PROP_"
KAFKA_SPARK_PROP_PREFIX = "SLICEWISE_KAFKA_SPARK_PROP_"

LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka-only names that `java_props` translates; never handed to Java as they are.
TRANSLATED = {"sasl.mechanisms", "sasl.username", "sasl.password", "ssl.ca.location"}


def java_props(props: Mapping[str, str], overrides: Mapping[str, str] = {}) -> dict[str, str]:  # noqa: B006 - read only
    """librdkafka properties -> the Java client's (for Spark's `kafka.*` options)."""
    java = {k: v for k, v in props.items() if k not in TRANSLATED}
    mechanism = props.get("sasl.mechanism") or props.get("sasl.mechanisms")
    if mechanism:
        java["sasl.mechanism"] = mechanism
    if "sasl.username" in props or "sasl.password" in props:
        module = LOGIN_MODULES.get((mechanism or "").upper())
        if module is None:
            raise ConfigError(
                f"sasl.username/sasl.password need sasl.mechanism PLAIN, SCRAM-SHA-256 or "
                f"SCRAM-SHA-512 (got {mechanism!r}); for GSSAPI or OAUTHBEARER set the Java "
                f"client's sasl.jaas.config with SLICEWISE_KAFKA_SPARK_PROP_SASL_JAAS_CONFIG."
            )
        user, password = props.get("sasl.username", ""), props.get("sasl.password", "")
        java["sasl.jaas.config"] = (
            f'{module} required username="{_jaas_quote(user)}" password="{_jaas_quote(password)}";'
        )
    if "ssl.ca.location" in props:
        # The Java client reads PEM trust stores too (Kafka 2.7+): the same CA file works.
        java["ssl.truststore.type"] = "PEM"
        java["ssl.truststore.location"] = props["ssl.ca.location"]
    return {**java, **overrides}


def env_from_connection(conn: Any) -> dict[str, str]:
    """SLICEWISE_KAFKA_* variables from an Airflow connection.

    host: bootstrap servers (`b1:9093,b2:9093`, or one host with the port field);
    login / password: SASL credentials; extra: librdkafka properties, for example
    {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
    "ssl.ca.location": "/etc/kafka/ca.pem"}, and optionally "spark": {...} with
    Java-only properties for Spark's reader.
    """
    if not conn.host:
        raise ConfigError(
            f"Airflow connection {conn.conn_id!r} has no host; set it to the Kafka bootstrap "
            f"servers, e.g. broker1:9093,broker2:9093."
        )
    bootstrap = f"{conn.host}:{conn.port}" if conn.port else conn.host
    env = {"SLICEWISE_KAFKA_BOOTSTRAP": bootstrap}
    extra = dict(conn.extra_dejson or {})
    spark = extra.pop("spark", {})
    if conn.login:
        extra["sasl.username"] = conn.login
    if conn.password:
        extra["sasl.password"] = conn.password
    env.update({_env_name(KAFKA_PROP_PREFIX, k): str(v) for k, v in extra.items()})
    env.update({_env_name(KAFKA_SPARK_PROP_PREFIX, k): str(v) for k, v in spark.items()})
    return env


def _env_name(prefix: str, prop: str) -> str:
    return prefix + prop.upper().replace(".", "_")


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
