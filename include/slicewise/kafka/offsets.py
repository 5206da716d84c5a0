"""What Kafka knows about a topic's offsets, behind a narrow interface.

All lookups use read_committed, so "latest" is the last stable offset (LSO):
the end of what may be read without cutting through an undecided transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from slicewise.config import Settings


class KafkaUnavailable(RuntimeError):
    """The broker could not be reached or the topic does not exist."""


def client_conf(settings: Settings) -> dict[str, str]:
    """librdkafka settings: bootstrap plus the pass-through security properties."""
    return {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka_props}


class TopicOffsets:
    """Earliest, last-stable and by-time offsets of one topic's partitions."""

    def __init__(self, settings: Settings, timeout: float = 30.0):
        self.topic = settings.topic
        self.timeout = timeout
        self._bootstrap = settings.bootstrap_servers
        self._admin = AdminClient(client_conf(settings))

    def partitions(self) -> list[int]:
        try:
            metadata = self._admin.list_topics(self.topic, timeout=self.timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"Kafka at {self._bootstrap} did not answer ({exc}); check SLICEWISE_KAFKA_BOOTSTRAP "
                "and the broker, then retry the task: nothing was written."
            ) from exc
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise KafkaUnavailable(
                f"topic {self.topic!r} does not exist on {self._bootstrap} "
                f"({topic.error if topic else 'not listed'}); create it or fix SLICEWISE_TOPIC."
            )
        return sorted(topic.partitions)

    def _list(self, spec: OffsetSpec, partitions: list[int] | None = None) -> dict[int, int]:
        partitions = self.partitions() if partitions is None else partitions
        request = {TopicPartition(self.topic, p): spec for p in partitions}
        try:
            futures = self._admin.list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=self.timeout
            )
            return {tp.partition: fut.result().offset for tp, fut in futures.items()}
        except KafkaException as exc:
            raise KafkaUnavailable(f"listing offsets of {self.topic!r} failed: {exc}") from exc

    def earliest(self, partitions: list[int] | None = None) -> dict[int, int]:
        """First offset still retained per partition (retention moves it forward)."""
        return self._list(OffsetSpec.earliest(), partitions)

    def last_stable(self, partitions: list[int] | None = None) -> dict[int, int]:
        """The LSO per partition: read_committed never returns records at or past it."""
        return self._list(OffsetSpec.latest(), partitions)

    def for_time(self, at: datetime, partitions: list[int] | None = None) -> dict[int, int | None]:
        """First offset whose timestamp is >= `at`, or None where no record has one yet."""
        found = self._list(OffsetSpec.for_timestamp(int(at.timestamp() * 1000)), partitions)
        return {p: (o if o >= 0 else None) for p, o in found.items()}

    def snapshot(self, at: datetime) -> tuple[dict[int, int | None], Mapping[int, int]]:
        """By-time offsets and LSOs, the LSOs taken after so the cap is never stale."""
        partitions = self.partitions()
        by_time = self.for_time(at, partitions)
        return by_time, self.last_stable(partitions)
