"""An unclean leader election below a stored boundary, on a real three-node cluster (a
KRaft controller and two brokers): the new leader's log, refilled past the boundary,
holds other records below it, and the next plan finds that by the leader epochs of
the records below each stored boundary (KIP-320) and refuses, naming the partition."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import ElectionType, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from slicewise.config import load_settings
from slicewise.ledger import Ledger
from slicewise.planner import plan_slice
from slicewise.slices import TopicReset
from slicewise_dev.cluster import running_cluster
from slicewise_dev.producer import event_value

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
LATER = datetime.now(timezone.utc) + timedelta(days=365)
TOPIC = "events"


def send(bootstrap: str, ids: list[str], at: datetime) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 2})
    for event_id in ids:
        value = event_value(event_id, at)
        producer.produce(TOPIC, value, partition=0, timestamp=int(at.timestamp() * 1000))
    assert producer.flush(30) == 0


def replicas(admin: AdminClient) -> tuple[int, list[int]]:
    """Partition 0's leader and in-sync replicas ((-1, []) until the metadata has it)."""
    found = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions.get(0)
    return (-1, []) if found is None else (found.leader, sorted(found.isrs))


def wait_for(what: str, check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_log_truncated_and_refilled_below_a_boundary_is_refused(tmp_path):
    with running_cluster(tmp_path / "cluster") as cluster:
        first, second = cluster.brokers[2], cluster.brokers[3]
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 2})
        topic = NewTopic(
            TOPIC,
            num_partitions=1,
            replica_assignment=[[2, 3]],
            config={"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
        )
        admin.create_topics([topic])[TOPIC].result(30)
        wait_for("both replicas in sync", lambda: replicas(admin)[1] == [2, 3])
        settings = load_settings(
            {
                **os.environ,
                "SLICEWISE_KAFKA_BOOTSTRAP": cluster.bootstrap,
                "SLICEWISE_TOPIC": TOPIC,
                "SLICEWISE_STATE_DIR": str(tmp_path / "state"),
                "SLICEWISE_LAKEHOUSE": str(tmp_path / "lakehouse"),
            }
        )
        send(cluster.bootstrap, [f"both-{i}" for i in range(5)], T0 + timedelta(minutes=10))
        second.stop()  # the follower falls behind; the leader goes on alone
        wait_for("the follower out of the ISR", lambda: replicas(admin)[1] == [2])
        send(first.bootstrap, [f"only-{i}" for i in range(5)], T0 + timedelta(minutes=20))
        hour0 = plan_slice(settings, T0, T0 + timedelta(hours=1), now=LATER)
        assert hour0.ranges == {0: (0, 10)}
        stored = Ledger.of(settings).boundary(T0 + timedelta(hours=1))
        assert set(stored.below) == {0} and stored.below[0][0] == 9, stored.below
        # The leader dies; the stale follower is elected though it is not in sync (an
        # unclean election), and new records refill its log past the boundary.
        first.stop()
        second.start(timeout=90)
        alone = AdminClient({"bootstrap.servers": second.bootstrap, "log_level": 2})
        wait_for_leader = lambda: replicas(alone)[0] == 3  # noqa: E731
        if not wait_for_leader():
            result = alone.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(TOPIC, 0)])
            result.result(30)
        wait_for("the unclean election", wait_for_leader)
        send(second.bootstrap, [f"new-{i}" for i in range(8)], T0 + timedelta(minutes=70))
        first.start(timeout=90)  # it truncates its log to the new leader's
        hour1 = (T0 + timedelta(hours=1), T0 + timedelta(hours=2))
        with pytest.raises(TopicReset, match="partition 0: the last record below the stored 10"):
            plan_slice(settings, *hour1, now=LATER)  # it would read [10, 13): 5 records lost
        # The safe action the message names: read the log as it is now, from its start.
        accepted = plan_slice(settings, *hour1, now=LATER, accept_topic_reset=True)
        assert accepted.ranges == {0: (0, 13)}
        assert [e["epoch"] for e in Ledger.of(settings).epochs()] == [1]
