"""A transactional, idempotent event producer (tests, demo and event source)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def event_value(
    event_id: Any,
    occurred_at: datetime,
    event_type: str = "click",
    payload: dict[str, Any] | None = None,
) -> bytes:
    """A record value that follows the event contract (docs/EVENT_CONTRACT.md)."""
    return json.dumps(
        {
            "event_id": event_id,
            "event_type": event_type,
            "occurred_at": occurred_at.isoformat().replace("+00:00", "Z"),
            "payload": payload if payload is not None else {},
        }
    ).encode()


@dataclass(frozen=True)
class Record:
    value: bytes | None
    partition: int
    timestamp: datetime
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def ensure_topic(
    conf: dict[str, str], topic: str, partitions: int = 3, retention_ms: int | None = None
) -> None:
    """Create the topic if missing (single broker: replication factor 1)."""
    admin = AdminClient(conf)
    config = {"retention.ms": str(retention_ms)} if retention_ms else {}
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config)])
    for fut in futures.values():
        try:
            fut.result()
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                raise


class TxProducer:
    """enable.idempotence + transactional.id; one open transaction at a time."""

    def __init__(self, conf: dict[str, str], topic: str, transactional_id: str):
        self.topic = topic
        self._producer = Producer(
            {
                **conf,
                "enable.idempotence": True,
                "transactional.id": transactional_id,
                "linger.ms": 5,
            }
        )
        self._producer.init_transactions(30)

    def _produce(self, records: Iterable[Record], on_delivered: Delivered | None = None) -> int:
        n = 0
        for r in records:
            self._producer.produce(
                self.topic,
                value=r.value,
                key=r.key,
                partition=r.partition,
                timestamp=int(r.timestamp.timestamp() * 1000),
                headers=r.headers or None,
                on_delivery=None if on_delivered is None else _reporter(on_delivered, r),
            )
            n += 1
            if n % 10_000 == 0:
                self._producer.poll(0)
        return n

    def begin(self, records: Iterable[Record], on_delivered: Delivered | None = None) -> int:
        """Open a transaction and send `records` into it (left open).

        `on_delivered(record, partition, offset)` is called for each record the broker took.
        """
        self._producer.begin_transaction()
        n = self._produce(records, on_delivered)
        self._producer.flush(30)
        return n

    def commit(self) -> None:
        self._producer.commit_transaction(30)

    def abort(self) -> None:
        self._producer.abort_transaction(30)

    def send(
        self, records: Iterable[Record], commit: bool = True, on_delivered: Delivered | None = None
    ) -> int:
        n = self.begin(records, on_delivered)
        self.commit() if commit else self.abort()
        return n


Delivered = Callable[[Record, int, int], None]


def _reporter(on_delivered: Delivered, record: Record) -> Callable[[Any, Any], None]:
    def report(err: Any, msg: Any) -> None:
        if err is None:
            on_delivered(record, msg.partition(), msg.offset())

    return report
