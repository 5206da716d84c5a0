"""The unit tier starts no JVM and no server: the fixtures that start them fail here,
and a test that starts a Java process any other way fails (tests/spark holds the
tests that need Spark, tests/integration those that need the other services)."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest


def _refuse(what: str) -> None:
    pytest.fail(
        f"tests/unit starts no JVM and no server, and this test asked for {what}: move it to "
        "tests/spark (Spark) or tests/integration (a broker, s3proxy, Airflow services)."
    )


@pytest.fixture(scope="session")
def connect_server() -> None:
    _refuse("the Spark Connect server")


@pytest.fixture(scope="session")
def spark_remote() -> None:
    _refuse("the Spark Connect server")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> None:
    _refuse("a Kafka broker")


@pytest.fixture(scope="session")
def local_s3() -> None:
    _refuse("s3proxy")


def _java() -> set[int]:
    return {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and "java" in p.name()
    }


@pytest.fixture(autouse=True)
def starts_no_jvm() -> Iterator[None]:
    before = _java()
    yield
    assert _java() <= before, "a unit test started a Java process (a JVM): move it to tests/spark"
