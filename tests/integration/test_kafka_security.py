"""A broker that demands SASL: credentials from an Airflow connection reach both clients,
librdkafka (planner, producer) and Spark's Java client (bronze)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from slicewise import cli
from slicewise.bronze import run_bronze
from slicewise.config import load_settings
from slicewise.kafka.offsets import KafkaUnavailable
from slicewise.operators import kafka_connection_env, task_settings
from slicewise.planner import plan_slice
from slicewise_dev.broker import running_broker
from slicewise_dev.producer import Record, TxProducer, event_value

pytestmark = pytest.mark.integration

PASSWORD = "SLICEWISE_KAFKA_PROP_SASL_PASSWORD"


@pytest.fixture
def sasl_broker(tmp_path):
    with running_broker(tmp_path / "broker", sasl_users={"etl": "etl-secret"}) as broker:
        yield f"127.0.0.1:{broker.sasl_port}"


def test_credentials_from_an_airflow_connection_reach_the_planner_and_spark(
    spark, sasl_broker, tmp_path, monkeypatch, capsys
):
    topic = "secured-events"
    connection = {
        "conn_type": "kafka",
        "host": sasl_broker,
        "login": "etl",
        "password": "etl-secret",
        "extra": {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_SECURED", json.dumps(connection))
    monkeypatch.setenv("SLICEWISE_KAFKA_CONN_ID", "kafka_secured")
    monkeypatch.setenv("SLICEWISE_TOPIC", topic)
    monkeypatch.setenv("SLICEWISE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SLICEWISE_LAKEHOUSE", raising=False)
    monkeypatch.delenv("SLICEWISE_KAFKA_BOOTSTRAP", raising=False)
    settings = task_settings()
    assert settings.bootstrap_servers == sasl_broker  # the only listener this test uses
    client = {"bootstrap.servers": sasl_broker, **settings.kafka_props}

    start = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(
        minute=0, second=0, microsecond=0
    )
    # The broker really checks: with a wrong password the planner stops, saying what to check.
    wrong = load_settings({**os.environ, **kafka_connection_env(), PASSWORD: "guess"})
    with pytest.raises(
        KafkaUnavailable, match="(?s)Authentication failed.*SLICEWISE_KAFKA_CONN_ID"
    ):
        plan_slice(wrong, start, start + timedelta(hours=1))
    # By hand, `slicewise plan` prints that message and its safe action, not a traceback.
    with monkeypatch.context() as by_hand:
        for name, value in {**kafka_connection_env(), PASSWORD: "guess"}.items():
            by_hand.setenv(name, value)
        window = ["--start", start.isoformat(), "--end", (start + timedelta(hours=1)).isoformat()]
        assert cli.main(["plan", *window]) == 1
    printed = capsys.readouterr().err
    assert "KafkaUnavailable: " in printed and "retry the task" in printed, printed
    assert "Traceback" not in printed

    admin = AdminClient(client)  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
    ts = start + timedelta(minutes=5)
    producer = TxProducer(client, topic, "tx-secured")
    producer.send([Record(event_value(f"s{i}", ts), i % 2, ts) for i in range(6)])

    sl = plan_slice(settings, start, start + timedelta(hours=1))
    assert sl.record_count_upper_bound >= 6
    result = run_bronze(spark, settings, sl.slice_id)  # Spark's Java client, SASL/PLAIN
    assert result.rows == 6 and result.committed
    bronze = spark.read.format("delta").load(settings.table("bronze"))
    assert sorted(json.loads(r.value)["event_id"] for r in bronze.collect()) == [
        f"s{i}" for i in range(6)
    ]
