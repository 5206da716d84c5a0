"""A local Kafka cluster of three processes: one KRaft controller and two brokers, for
what a single broker cannot show (a replica falling behind, an unclean leader election).

Each node is a `LocalBroker` with its own state folder and one role; all are formatted
with one cluster id and a static voter set (the controller), as `LocalBroker` is.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from slicewise.config import load_settings
from slicewise.connect_server import port_open
from slicewise_dev.broker import BrokerError, LocalBroker, _random_cluster_id, free_ports


class ClusterNode(LocalBroker):
    """One process of the cluster: the controller (node 1) or a broker (2, 3, ...)."""

    def __init__(
        self, state_dir: Path, node_id: int, port: int, voters: str, cluster_id: str
    ) -> None:
        # `port`: the broker's PLAINTEXT port, or the controller's CONTROLLER port. The
        # base class checks `port` (and a non-None controller_port) are free at start.
        super().__init__(state_dir / f"node-{node_id}", load_settings().cache_dir, port=port)
        self.controller_port = None  # type: ignore[assignment]
        self.node_id, self.voters, self.the_cluster_id = node_id, voters, cluster_id

    @property
    def is_controller(self) -> bool:
        return self.node_id == 1

    def server_properties(self) -> dict[str, str]:
        common = {
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
        }
        if self.is_controller:
            return {
                **common,
                "process.roles": "controller",
                "listeners": f"CONTROLLER://{self.host}:{self.port}",
            }
        return {
            **common,
            "process.roles": "broker",
            "listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            # Internal topics on one replica: the cluster works with either broker down.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            # A follower that stops fetching leaves the ISR within seconds.
            "replica.lag.time.max.ms": "3000",
        }

    def format(self) -> bool:
        if self.is_formatted():
            return False
        self.write_config()
        result = subprocess.run(
            [
                *self._java(self.ensure_jars()),
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self.the_cluster_id,
                "-c",
                str(self.config_path),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0 or not self.is_formatted():
            raise BrokerError(
                f"Formatting node {self.node_id} failed (exit {result.returncode}):\n"
                + (result.stdout + result.stderr).strip()
            )
        return True

    def is_healthy(self, timeout: float = 5.0) -> bool:
        """The controller: its port answers. A broker: the cluster's metadata lists it."""
        if not port_open(self.port, self.host):
            return False
        if self.is_controller:
            return True
        try:
            metadata = AdminClient(
                {"bootstrap.servers": self.bootstrap, "log_level": 2}
            ).list_topics(timeout=timeout)
        except KafkaException:
            return False
        return metadata.cluster_id == self.the_cluster_id and self.node_id in metadata.brokers


class LocalCluster:
    """The controller and two brokers (ids 2 and 3), started and stopped together."""

    def __init__(self, state_dir: Path) -> None:
        controller, *brokers = free_ports(3)
        cluster_id = _random_cluster_id()
        voters = f"1@127.0.0.1:{controller}"
        self.controller = ClusterNode(state_dir, 1, controller, voters, cluster_id)
        self.brokers = {
            node: ClusterNode(state_dir, node, port, voters, cluster_id)
            for node, port in zip((2, 3), brokers, strict=True)
        }

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def start(self) -> None:
        self.controller.start(timeout=90)
        for broker in self.brokers.values():
            broker.start(timeout=90)

    def stop(self) -> None:
        for node in (*self.brokers.values(), self.controller):
            node.stop()


@contextmanager
def running_cluster(state_dir: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(state_dir)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
