"""The idempotent writer, shown: a proxy loses the broker's acknowledgements of Produce
requests, so the producer sends those batches again. Without idempotence the topic gets
duplicates; with it, none."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from slicewise_dev.broker import free_ports, running_broker
from slicewise_dev.proxy import DroppingProxy

pytestmark = pytest.mark.integration

LOST_ACKS = 3
MESSAGES = 12


@pytest.fixture
def proxied(tmp_path):
    """A broker that only clients going through the proxy can reach."""
    port, controller_port, proxy_port = free_ports(3)
    with (
        DroppingProxy(proxy_port, port) as proxy,
        running_broker(
            tmp_path / "broker",
            port=port,
            controller_port=controller_port,
            advertised_port=proxy_port,
        ) as broker,
    ):
        yield broker.bootstrap, proxy


def produce_with_lost_acks(bootstrap: str, proxy: DroppingProxy, topic: str, idempotent: bool):
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": idempotent,
            "acks": "all",
            "max.in.flight.requests.per.connection": 1,
            "retry.backoff.ms": 50,
            "message.timeout.ms": 60000,
        }
    )
    producer.list_topics(topic, timeout=30)  # connected before the faults start
    proxy.lose_next_acks(LOST_ACKS)
    dropped_before = proxy.dropped
    failures = []
    for i in range(MESSAGES):  # one Produce request per message: each is acked before the next
        producer.produce(
            topic,
            value=f"m{i}".encode(),
            partition=0,
            on_delivery=lambda e, _m: e and failures.append(e),
        )
        assert producer.flush(60) == 0
    assert not failures, failures  # every message was acknowledged in the end
    assert proxy.dropped - dropped_before == LOST_ACKS  # and the faults really happened


def log_of(bootstrap: str, topic: str) -> Counter:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"read-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    seen: Counter = Counter()
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    position = 0
    while position < high:
        msg = consumer.poll(10)
        assert msg is not None, f"stopped at offset {position} of {high}"
        assert msg.error() is None, msg.error()
        seen[msg.value().decode()] += 1
        position = msg.offset() + 1
    consumer.close()
    return seen


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_lost_acks_duplicate_only_without_idempotence(proxied, idempotent):
    bootstrap, proxy = proxied
    topic = f"acks-{'idempotent' if idempotent else 'plain'}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)

    produce_with_lost_acks(bootstrap, proxy, topic, idempotent)

    log = log_of(bootstrap, topic)
    assert set(log) == {f"m{i}" for i in range(MESSAGES)}  # nothing lost either way
    duplicated = sum(n - 1 for n in log.values())
    if idempotent:
        assert duplicated == 0, log
    else:
        assert duplicated == LOST_ACKS, log  # each resent batch is a second copy
