"""The broker behaves the way the exactly-once pipeline relies on: transactions work
on one broker, read_committed hides aborted and still-open records, and the last
stable offset (LSO) stops before an open transaction."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from slicewise.config import load_settings
from slicewise_dev.broker import BrokerError, LocalBroker, free_ports

pytestmark = pytest.mark.integration


def conf(bootstrap: str, **extra: object) -> dict[str, object]:
    return {"bootstrap.servers": bootstrap, **load_settings().kafka_props, **extra}


def transactional_producer(bootstrap: str) -> Producer:
    producer = Producer(
        conf(
            bootstrap,
            **{
                "transactional.id": f"test-{uuid.uuid4().hex}",
                "enable.idempotence": True,
            },
        )
    )
    producer.init_transactions(30)
    return producer


def read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[bytes]:
    """Every value from the start of each partition up to its end (the LSO for read_committed)."""
    consumer = Consumer(
        conf(
            bootstrap,
            **{
                "group.id": f"test-{uuid.uuid4().hex}",
                "isolation.level": isolation,
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            },
        )
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    values: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            values.append(msg.value())
    finally:
        consumer.close()
    assert len(at_end) == partitions, f"only partitions {sorted(at_end)} reached their end in 30s"
    return values


def latest_offset(admin: AdminClient, topic: str, isolation: IsolationLevel) -> int:
    tp = TopicPartition(topic, 0)
    futures = admin.list_offsets(
        {tp: OffsetSpec.latest()}, isolation_level=isolation, request_timeout=30
    )
    return futures[tp].result(timeout=30).offset


def test_broker_serves_metadata(kafka_bootstrap: str) -> None:
    metadata = AdminClient(conf(kafka_bootstrap)).list_topics(timeout=30)
    assert metadata.cluster_id
    assert metadata.brokers


def test_topic_is_created_with_three_partitions(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    metadata = AdminClient(conf(kafka_bootstrap)).list_topics(topic, timeout=30)
    assert sorted(metadata.topics[topic].partitions) == [0, 1, 2]


def test_read_committed_sees_only_committed_records(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    producer = transactional_producer(kafka_bootstrap)

    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, key=f"k{i}", value=f"committed-{i}")
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, key=f"k{i}", value=f"aborted-{i}")
    producer.flush(30)  # the aborted records really reach the log before the abort
    producer.abort_transaction(30)

    committed = sorted(v.decode() for v in read_to_end(kafka_bootstrap, topic, 3, "read_committed"))
    everything = sorted(
        v.decode() for v in read_to_end(kafka_bootstrap, topic, 3, "read_uncommitted")
    )
    assert committed == [f"committed-{i}" for i in range(6)]
    assert everything == sorted(committed + [f"aborted-{i}" for i in range(4)])


def test_last_stable_offset_stops_before_open_transaction(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    admin = AdminClient(conf(kafka_bootstrap))
    producer = transactional_producer(kafka_bootstrap)
    delivered: list[Message] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        delivered.append(msg)

    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, value=f"committed-{i}", on_delivery=on_delivery)
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=f"open-{i}", on_delivery=on_delivery)
    producer.flush(30)  # on the broker, but the transaction stays open
    first_open = delivered[2].offset()

    lso = latest_offset(admin, topic, IsolationLevel.READ_COMMITTED)
    high_watermark = latest_offset(admin, topic, IsolationLevel.READ_UNCOMMITTED)
    assert lso == first_open
    assert high_watermark == delivered[-1].offset() + 1
    assert read_to_end(kafka_bootstrap, topic, 1, "read_committed") == [
        b"committed-0",
        b"committed-1",
    ]

    producer.commit_transaction(30)
    # The coordinator writes the commit marker (one offset) just *after* commit returns,
    # so the LSO catches up a moment later; then nothing is undecided.
    deadline = time.monotonic() + 15
    while latest_offset(admin, topic, IsolationLevel.READ_COMMITTED) != high_watermark + 1:
        assert time.monotonic() < deadline, "LSO did not move past the committed transaction"
        time.sleep(0.05)
    assert latest_offset(admin, topic, IsolationLevel.READ_UNCOMMITTED) == high_watermark + 1


def test_local_broker_refuses_a_port_taken_by_another_broker(tmp_path) -> None:
    # Brokers of its own, so this runs whatever broker the session uses.
    cache = load_settings().cache_dir
    port, controller_port, other_controller = free_ports(3)
    first = LocalBroker(tmp_path / "first", cache, port=port, controller_port=controller_port)
    other = LocalBroker(tmp_path / "other", cache, port=port, controller_port=other_controller)
    first.start(timeout=120)
    try:
        assert not other.is_running()
        assert not other.is_healthy()  # the first broker answers there, but it is not this one
        with pytest.raises(BrokerError, match="taken"):
            other.start()
        assert first.is_healthy()  # the refused start left the running broker alone
    finally:
        first.stop()
    assert not first.is_running()
