"""A transactional, idempotent event producer (the event source, tests and bench)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from slicewise.kafka.offsets import TopicOffsets


def event_value(
    event_id: Any,
    occurred_at: datetime,
    event_type: str = "click",
    payload: dict[str, Any] | None = None,
) -> bytes:
    """A record value that follows the event contract (docs/PIPELINES.md)."""
    return json.dumps(
        {
            "event_id": event_id,
            "event_type": event_type,
            "occurred_at": occurred_at.isoformat().replace("+00:00", "Z"),
            "payload": payload if payload is not None else {},
        }
    ).encode()


def avro_value(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """A record in the Confluent wire format: the magic byte 0, the writer schema's
    registry id (4 bytes, big-endian), the record's Avro binary body."""
    import fastavro

    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()


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
        self._offsets = TopicOffsets(conf, topic)
        self._first: dict[int, int] = {}  # lowest offset per partition in the open transaction
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
                on_delivery=self._reporter(r, on_delivered),
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
        self._first = {}
        n = self._produce(records, on_delivered)
        self._producer.flush(30)
        return n

    def commit(self, timeout: float = 30.0) -> None:
        self._producer.commit_transaction(timeout)
        self._settle(timeout)

    def abort(self, timeout: float = 30.0) -> None:
        self._producer.abort_transaction(timeout)
        self._settle(timeout)

    def _settle(self, timeout: float) -> None:
        """Return once this transaction no longer holds any partition's LSO.

        The broker answers a commit or abort before it has written the markers, so
        the last stable offset can stay at the transaction's first offset for a
        moment; a planner that runs right after would freeze a boundary short of
        records we call committed. (An older open transaction that holds the LSO
        further back is someone else's: nothing to wait for.)
        """
        deadline = time.monotonic() + timeout
        while self._first:
            lso = self._offsets.last_stable(list(self._first))
            self._first = {p: o for p, o in self._first.items() if lso[p] == o}
            if self._first and time.monotonic() > deadline:
                raise TimeoutError(f"{self.topic}: transaction markers not written: {self._first}")
            if self._first:
                time.sleep(0.05)

    def _reporter(
        self, record: Record, on_delivered: Delivered | None
    ) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            if err is None:
                p, o = msg.partition(), msg.offset()
                self._first[p] = min(o, self._first.get(p, o))
                if on_delivered is not None:
                    on_delivered(record, p, o)

        return report

    def send(
        self, records: Iterable[Record], commit: bool = True, on_delivered: Delivered | None = None
    ) -> int:
        n = self.begin(records, on_delivered)
        self.commit() if commit else self.abort()
        return n


Delivered = Callable[[Record, int, int], None]
