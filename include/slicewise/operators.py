"""Airflow pieces the DAG needs beyond wiring: Kafka settings from an Airflow connection.

Set SLICEWISE_KAFKA_CONN_ID to the id of a connection (host = bootstrap servers,
login/password = SASL credentials, extra = librdkafka properties; see
`slicewise.kafka.security.env_from_connection`). It is read when a task runs,
never while the DAG is parsed, and reaches spark-submit as environment variables,
not as templates, so credentials never show among a task's rendered fields.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

KAFKA_CONN_ID_ENV = "SLICEWISE_KAFKA_CONN_ID"


def kafka_connection_env() -> dict[str, str]:
    """SLICEWISE_KAFKA_* variables from the configured connection; {} when none is set."""
    conn_id = os.environ.get(KAFKA_CONN_ID_ENV, "").strip()
    if not conn_id:
        return {}
    from airflow.sdk import BaseHook

    from slicewise.kafka.security import env_from_connection

    return env_from_connection(BaseHook.get_connection(conn_id))


def task_settings():
    """Settings for code running in an Airflow task: environment, then the Kafka connection."""
    from slicewise.config import load_settings

    return load_settings({**os.environ, **kafka_connection_env()})


class SliceSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit of one slice step, with the Kafka connection's settings in its environment."""

    def execute(self, context: Any) -> None:
        self.env_vars = {**(self.env_vars or {}), **kafka_connection_env()}
        super().execute(context)
