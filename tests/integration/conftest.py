"""Per-test pipelines: a fresh topic, a fresh lakehouse, a transactional producer."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from slicewise.config import Settings, load_settings
from slicewise.kafka.producer import TxProducer


@pytest.fixture
def pipeline_factory(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., tuple[Settings, TxProducer]]]:
    """`pipeline_factory(topic=None, **env)`: settings for a new lakehouse (and topic)."""
    producers: list[TxProducer] = []

    def make(
        topic: str | None = None, partitions: int = 3, **env: str
    ) -> tuple[Settings, TxProducer]:
        topic = topic or new_topic(partitions)
        state = tmp_path_factory.mktemp("state")
        settings = load_settings(
            {
                **os.environ,
                "SLICEWISE_KAFKA_BOOTSTRAP": kafka_bootstrap,
                "SLICEWISE_TOPIC": topic,
                "SLICEWISE_STATE_DIR": str(state),
                "SLICEWISE_LAKEHOUSE": str(state / "lakehouse"),
                **env,
            }
        )
        producer = TxProducer(
            {"bootstrap.servers": kafka_bootstrap, **settings.kafka_props},
            topic,
            f"tx-{topic}-{len(producers)}",
        )
        producers.append(producer)
        return settings, producer

    yield make


@pytest.fixture
def pipeline(
    pipeline_factory: Callable[..., tuple[Settings, TxProducer]],
) -> tuple[Settings, TxProducer]:
    return pipeline_factory()
