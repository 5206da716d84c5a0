"""What Kafka knows about a topic's offsets, behind a narrow interface.

All lookups use read_committed, so "latest" is the last stable offset (LSO):
the end of what may be read without cutting through an undecided transaction.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from slicewise.config import Settings
from slicewise.errors import OperationalError


class KafkaUnavailable(OperationalError):
    """The broker could not be reached or the topic does not exist: raised before anything
    is written, with what to check in its message."""


def client_conf(settings: Settings) -> dict[str, str]:
    """librdkafka settings: bootstrap plus the pass-through security properties."""
    return {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka_props}


class TopicOffsets:
    """Earliest, last-stable and by-time offsets of one topic's partitions."""

    def __init__(self, conf: Mapping[str, str], topic: str, timeout: float = 30.0):
        """`conf`: librdkafka settings (bootstrap.servers and any security properties)."""
        self.topic = topic
        self.timeout = timeout
        self._conf = dict(conf)
        self._bootstrap = conf["bootstrap.servers"]
        # librdkafka reports why it could not connect (bad credentials, TLS) only here.
        self._errors: deque[KafkaError] = deque(maxlen=20)
        self._admin = AdminClient({**conf, "error_cb": self._errors.append})

    @classmethod
    def of(cls, settings: Settings, timeout: float = 30.0) -> TopicOffsets:
        """The offsets of the configured topic."""
        return cls(client_conf(settings), settings.topic, timeout)

    def partitions(self) -> list[int]:
        try:
            metadata = self._admin.list_topics(self.topic, timeout=self.timeout)
        except KafkaException as exc:
            self._admin.poll(0)  # serves error_cb
            auth = [e for e in self._errors if e.code() == KafkaError._AUTHENTICATION]
            raise KafkaUnavailable(
                f"Kafka at {self._bootstrap} did not answer ({auth[0].str() if auth else exc}); "
                "check SLICEWISE_KAFKA_BOOTSTRAP, "
                "the credentials (SLICEWISE_KAFKA_CONN_ID or SLICEWISE_KAFKA_PROP_*) and the "
                "broker, then retry the task: nothing was written."
            ) from exc
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise KafkaUnavailable(
                f"topic {self.topic!r} does not exist on {self._bootstrap} "
                f"({topic.error if topic else 'not listed'}); create it or fix SLICEWISE_TOPIC."
            )
        return sorted(topic.partitions)

    def topic_id(self) -> str | None:
        """The topic's id (KIP-516): a topic deleted and recreated under its name gets a
        new one. None from a broker too old to give one (before Kafka 2.8)."""
        try:
            futures = self._admin.describe_topics(
                TopicCollection([self.topic]), request_timeout=self.timeout
            )
            found = futures[self.topic].result().topic_id
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"describing topic {self.topic!r} failed: {exc}; check the broker, then retry "
                "the task: nothing was written."
            ) from exc
        return None if found is None or str(found) == "AAAAAAAAAAAAAAAAAAAAAA" else str(found)

    def cleanup_policy(self) -> str | None:
        """The topic's `cleanup.policy` (`delete`, `compact` or `compact,delete`); None
        when the principal may not describe the topic's configuration (an ACL that grants
        reads only), which many locked-down clusters do."""
        resource = ConfigResource(ResourceType.TOPIC, self.topic)
        try:
            futures = self._admin.describe_configs([resource], request_timeout=self.timeout)
            configs = next(iter(futures.values())).result()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() in (
                KafkaError.TOPIC_AUTHORIZATION_FAILED,
                KafkaError.CLUSTER_AUTHORIZATION_FAILED,
            ):
                return None
            raise KafkaUnavailable(
                f"describing topic {self.topic!r}'s configuration failed: {exc}; check the "
                "broker (and DESCRIBE_CONFIGS on the topic), then retry: nothing was written."
            ) from exc
        entry = configs.get("cleanup.policy")
        return "delete" if entry is None or entry.value is None else entry.value

    def _list(
        self,
        spec: OffsetSpec,
        partitions: list[int] | None = None,
        isolation: IsolationLevel = IsolationLevel.READ_COMMITTED,
    ) -> dict[int, int]:
        partitions = self.partitions() if partitions is None else partitions
        request = {TopicPartition(self.topic, p): spec for p in partitions}
        try:
            futures = self._admin.list_offsets(
                request, isolation_level=isolation, request_timeout=self.timeout
            )
            return {tp.partition: fut.result().offset for tp, fut in futures.items()}
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"listing offsets of {self.topic!r} failed: {exc}; check the broker, then "
                "retry the task: nothing was written."
            ) from exc

    def earliest(self, partitions: list[int] | None = None) -> dict[int, int]:
        """First offset still retained per partition (retention moves it forward)."""
        return self._list(OffsetSpec.earliest(), partitions)

    def last_stable(self, partitions: list[int] | None = None) -> dict[int, int]:
        """The LSO per partition: read_committed never returns records at or past it."""
        return self._list(OffsetSpec.latest(), partitions)

    def high_watermarks(self, partitions: list[int] | None = None) -> dict[int, int]:
        """The end of the log per partition, undecided transactions included."""
        return self._list(OffsetSpec.latest(), partitions, IsolationLevel.READ_UNCOMMITTED)

    def for_time(self, at: datetime, partitions: list[int] | None = None) -> dict[int, int | None]:
        """First offset whose timestamp is >= `at`, or None where no record has one yet."""
        found = self._list(OffsetSpec.for_timestamp(int(at.timestamp() * 1000)), partitions)
        return {p: (o if o >= 0 else None) for p, o in found.items()}

    def first_committed_at_or_after(
        self, at: datetime, start: Mapping[int, int], stop: Mapping[int, int]
    ) -> dict[int, int | None]:
        """Scan forward from `start` for the first committed record with timestamp >= `at`.

        Kafka's by-time lookup also matches transaction markers, which carry the
        broker's clock, not the producer's: a marker written now in front of
        back-dated records would end a slice early. Reading the records from the
        lookup's answer skips markers (and aborted records) so the boundary lands
        on a real record. None when no record before `stop` qualifies.
        """
        target = int(at.timestamp() * 1000)
        found: dict[int, int | None] = {p: None for p in start}

        def take(msg: Message) -> bool:
            p = msg.partition()
            if msg.offset() >= stop[p]:
                return True
            if msg.timestamp()[1] >= target:
                found[p] = msg.offset()
                return True
            return False

        todo = {p: o for p, o in start.items() if o < stop[p]}
        self._scan(todo, "read_committed", take, f"for {at.isoformat()}")
        return found

    # Transaction markers take an offset each and are never delivered: the last record
    # below an offset lies within this many of it (a marker per transaction that ended
    # there with no record after it).
    BELOW_WINDOW = 16

    def last_records_below(self, ends: Mapping[int, int]) -> dict[int, tuple[int, int] | None]:
        """Per partition, the last record below `ends[p]` (within `BELOW_WINDOW`; aborted
        records too, they keep their offsets) and the leader epoch it was written in
        (KIP-320); None where there is none or the broker gives no epoch."""
        found: dict[int, tuple[int, int] | None] = {p: None for p in ends}

        def take(msg: Message) -> bool:
            p = msg.partition()
            if msg.offset() >= ends[p]:
                return True
            epoch = msg.leader_epoch()
            found[p] = None if epoch is None else (msg.offset(), epoch)
            return msg.offset() == ends[p] - 1

        start = {p: max(0, o - self.BELOW_WINDOW) for p, o in ends.items() if o > 0}
        self._scan(start, "read_uncommitted", take, "for the records below its boundaries")
        return found

    def _scan(
        self, start: Mapping[int, int], isolation: str, take: Callable[[Message], bool], what: str
    ) -> None:
        """Read each partition from `start[p]` until `take` says it is done with it, or
        its end (`auto.offset.reset` earliest: from the log start if `start` lies below)."""
        todo = dict(start)
        if not todo:
            return
        consumer = Consumer(
            {
                **self._conf,
                "group.id": "slicewise-boundary-scan",
                "enable.auto.commit": False,
                "isolation.level": isolation,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                # librdkafka stops fetching for this long whenever its queue holds
                # `queued.min.messages` (100,000): with the 1 s default a scan through a
                # back-dated slice waited most of its time (2 M records: 8.4 s, 1.6 s here).
                "fetch.queue.backoff.ms": 10,
            }
        )
        try:
            consumer.assign([TopicPartition(self.topic, p, o) for p, o in todo.items()])
            deadline = time.monotonic() + self.timeout
            while todo:
                if time.monotonic() > deadline:
                    raise KafkaUnavailable(
                        f"scanning {self.topic} partitions {sorted(todo)} {what} took over "
                        f"{self.timeout}s; check the broker, then retry the task: nothing "
                        "was written."
                    )
                # A short wait: consume() returns only once it holds 500 messages or the
                # timeout passes, so a partition's EOF waited a full second at 1.0.
                for msg in consumer.consume(500, timeout=0.1):
                    p = msg.partition()
                    if p not in todo:
                        continue
                    # An error here is the partition's EOF: nothing (more) to read.
                    if msg.error() is not None or take(msg):
                        todo.pop(p)
                        consumer.incremental_unassign([TopicPartition(self.topic, p)])
        finally:
            consumer.close()

    def snapshot(self, at: datetime) -> tuple[dict[int, int | None], Mapping[int, int]]:
        """Boundary inputs: the first committed record at/after `at`, and the LSOs.

        The LSOs are taken first and bound the scan, so nothing past an open
        transaction is ever looked at.
        """
        partitions = self.partitions()
        lso = self.last_stable(partitions)
        by_time = self.for_time(at, partitions)
        hits = {p: o for p, o in by_time.items() if o is not None and o < lso[p]}
        scanned = self.first_committed_at_or_after(at, hits, lso)
        return {p: scanned.get(p) for p in partitions}, lso
