"""docker-compose.yml cannot be run here (no Docker engine); check it parses and agrees with the code."""

from pathlib import Path

import yaml

from slicewise.config import LOCAL_BOOTSTRAP
from slicewise.kafka.broker import KAFKA_VERSION

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def test_compose_file_is_consistent_with_the_code():
    spec = yaml.safe_load(COMPOSE.read_text())
    kafka = spec["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    port = LOCAL_BOOTSTRAP.split(":")[1]
    assert f"127.0.0.1:{port}:{port}" in kafka["ports"]
    env = kafka["environment"]
    assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{LOCAL_BOOTSTRAP}"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    for volume in (v.split(":")[0] for v in kafka["volumes"]):
        assert volume in spec["volumes"]
