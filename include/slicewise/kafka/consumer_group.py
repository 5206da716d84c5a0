"""A consumer group's committed offsets on one topic: what Kafka's lag tools read.

slicewise never consumes through a group. It writes the group's offsets after a
publication, so that `kafka-consumer-groups.sh --describe`, Burrow or kafka-exporter
show the pipeline's lag. The offsets follow Kafka's convention: the next offset to read.

Offsets go through a consumer that never joins the group (no subscribe, no assign):
its commits are a standalone consumer's, which the broker accepts while the group has
no members. Not through the admin API's offset calls: librdkafka's admin client crashes
the process when it asks for the offsets of a group whose coordinator is still loading
(confluent-kafka-python#1982). The consumer, though, only times out where the broker
refuses the group, so the admin API's description of the group comes first: it names
a missing ACL, and the members of a group someone else consumes with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

T = TypeVar("T")
NOT_COMMITTED = -1001  # librdkafka's OFFSET_INVALID: the group holds nothing there
# Answers that mean "ask again shortly", which the admin API does not mark retriable.
COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}


class ConsumerGroup:
    """One group's offsets on one topic; use it as a context manager."""

    def __init__(self, conf: Mapping[str, str], name: str, topic: str, timeout: float = 10.0):
        """`conf`: librdkafka settings (bootstrap.servers and any security properties)."""
        self.name = name
        self.topic = topic
        self.timeout = timeout
        self._admin = AdminClient(dict(conf))
        self._consumer = Consumer(
            {
                **conf,
                "group.id": name,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
        )

    def __enter__(self) -> ConsumerGroup:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._consumer.close()

    def members(self) -> int:
        """How many consumers are in the group now (raises if the broker refuses it)."""

        def describe() -> int:
            (future,) = self._admin.describe_consumer_groups(
                [self.name], request_timeout=self.timeout
            ).values()
            return len(future.result().members)

        return self._retrying(describe)

    def partitions(self) -> set[int]:
        """The topic's partitions now."""
        metadata = self._consumer.list_topics(self.topic, timeout=self.timeout)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            return set()
        return set(topic.partitions)

    def committed(self, partitions: Iterable[int]) -> dict[int, tuple[int, str | None]]:
        """Offset and metadata the group holds per partition (absent: none committed)."""
        request = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        found = self._retrying(
            lambda: _checked(self._consumer.committed(request, timeout=self.timeout))
        )
        return {
            tp.partition: (tp.offset, tp.metadata) for tp in found if tp.offset != NOT_COMMITTED
        }

    def commit(self, offsets: Mapping[int, int], metadata: str) -> None:
        """Set the group's offsets of these partitions in one request."""
        request = [
            TopicPartition(self.topic, p, offset, metadata=metadata)
            for p, offset in sorted(offsets.items())
        ]
        self._retrying(
            lambda: _checked(self._consumer.commit(offsets=request, asynchronous=False) or [])
        )

    def _retrying(self, call: Callable[[], T]) -> T:
        """`call`, again while the broker says to retry: the first requests for a group
        find its coordinator still loading (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return call()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not isinstance(error, KafkaError) or not (
                    error.retriable() or error.code() in COORDINATOR_MOVING
                ):
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def _checked(partitions: list[TopicPartition]) -> list[TopicPartition]:
    """The partitions, unless the broker refused one of them."""
    for tp in partitions:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return partitions
