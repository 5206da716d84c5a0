"""After each publication the pipeline's consumer group holds the slice's upper boundary,
as Kafka's own `kafka-consumer-groups.sh --describe` shows it: lag 0 after the last
publication, the new records once more arrive, unchanged by a backfill of an old hour.
Without an ACL for the group the publication stands and says so."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from slicewise import cli
from slicewise.acknowledge import acknowledge
from slicewise.config import load_settings
from slicewise.gate import run_gate
from slicewise.home import REPO_ROOT
from slicewise.ingest import run_ingest
from slicewise.ledger import Ledger
from slicewise.planner import plan_slice
from slicewise.publish import run_publish
from slicewise_dev.broker import running_broker
from slicewise_dev.producer import Record, TxProducer, event_value

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(days=1)).replace(
    hour=0, minute=0, second=0, microsecond=0
)
HOUR = timedelta(hours=1)
LATER = datetime.now(timezone.utc) + timedelta(days=365)
TOOL = REPO_ROOT / "scripts" / "kafka-consumer-groups.sh"


def consumer_groups(bootstrap: str, *args: str) -> str:
    """Kafka's consumer-group tool, as an operator runs it."""
    done = subprocess.run(
        [str(TOOL), "--bootstrap-server", bootstrap, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def describe(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, int, int]]:
    """Partition -> (current offset, log-end offset, lag), from `--describe`."""
    rows = {}
    for line in consumer_groups(bootstrap, "--describe", "--group", group).splitlines():
        cells = line.split()
        if cells[:2] == [group, topic]:
            rows[int(cells[2])] = (int(cells[3]), int(cells[4]), int(cells[5]))
    return rows


def publish_hour(spark, settings, hour: int):
    sl = plan_slice(settings, T0 + hour * HOUR, T0 + (hour + 1) * HOUR, now=LATER)
    run_ingest(spark, settings, sl.slice_id)
    run_gate(spark, settings, sl.slice_id)
    run_publish(spark, settings, sl.slice_id)
    return sl


def test_the_group_follows_publication_forward_and_lag_tools_see_it(
    spark, pipeline, kafka_bootstrap
):
    settings, producer = pipeline
    group = settings.pipeline.consumer_group_name
    assert group == "slicewise.events"
    producer.send(
        [
            Record(
                event_value(f"e{h}-{i}", T0 + h * HOUR + i * timedelta(minutes=9)),
                i % 3,
                T0 + h * HOUR + i * timedelta(minutes=9),
            )
            for h in range(3)
            for i in range(6)
        ]
    )
    publish_hour(spark, settings, 1)
    newest = publish_hour(spark, settings, 2)

    assert group in consumer_groups(kafka_bootstrap, "--list").split()
    after_publication = describe(kafka_bootstrap, group, settings.topic)
    assert after_publication == {p: (newest.ranges[p][1], newest.ranges[p][1], 0) for p in range(3)}

    # Records arrive that no slice holds yet (one at a time, without a transaction, so
    # that the log end moves by exactly these records and no commit marker).
    late = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i in range(5):
        late.produce(settings.topic, event_value(f"late{i}", T0 + 3.5 * HOUR), partition=0)
    assert late.flush(30) == 0
    arrived = describe(kafka_bootstrap, group, settings.topic)
    assert arrived[0][2] == 5 and arrived[1][2] == arrived[2][2] == 0

    # A backfill of an older hour, and a rerun of the newest publication, leave it alone.
    old = publish_hour(spark, settings, 0)
    run_publish(spark, settings, newest.slice_id)
    assert describe(kafka_bootstrap, group, settings.topic) == arrived
    ledger = Ledger.of(settings)
    # Each commits the run's end again: the same offsets.
    assert ledger.step(old.slice_id, "acknowledge")["committed"] == newest.slice_id
    assert ledger.step(newest.slice_id, "acknowledge")["committed"] == newest.slice_id


def test_the_group_never_passes_a_slice_not_yet_published(spark, pipeline, kafka_bootstrap):
    """Two runs at once: the later hour publishes first. Lag tools must not see the
    earlier hour's records as processed before gold holds them (issue 66, finding 7)."""
    settings, producer = pipeline
    group = settings.pipeline.consumer_group_name
    producer.send(
        [
            Record(event_value(f"e{h}-{i}", T0 + h * HOUR), i % 3, T0 + h * HOUR)
            for h in range(2)
            for i in range(6)
        ]
    )
    first = plan_slice(settings, T0, T0 + HOUR, now=LATER)
    second = publish_hour(spark, settings, 1)
    assert describe(kafka_bootstrap, group, settings.topic) == {}
    ledger = Ledger.of(settings)
    assert ledger.step(second.slice_id, "acknowledge")["waits_for"] == first.slice_id

    run_ingest(spark, settings, first.slice_id)
    run_gate(spark, settings, first.slice_id)
    run_publish(spark, settings, first.slice_id)
    ends = {p: second.ranges[p][1] for p in range(3)}
    assert {
        p: row[0] for p, row in describe(kafka_bootstrap, group, settings.topic).items()
    } == ends
    assert ledger.step(first.slice_id, "acknowledge")["committed"] == second.slice_id


def test_a_definition_can_turn_the_group_off(spark, pipeline_factory, kafka_bootstrap, tmp_path):
    definitions = tmp_path / "pipelines.yaml"
    source = (REPO_ROOT / "pipelines.yaml").read_text()
    definitions.write_text(
        source.replace("  events:\n", "  events:\n    consumer_group: false\n", 1)
    )
    settings, producer = pipeline_factory(SLICEWISE_PIPELINES_FILE=str(definitions))
    assert settings.pipeline.consumer_group_name is None
    producer.send([Record(event_value("x", T0 + 0.5 * HOUR), 0, T0 + 0.5 * HOUR)])
    sl = publish_hour(spark, settings, 0)
    assert Ledger.of(settings).step(sl.slice_id, "acknowledge") is None
    assert describe(kafka_bootstrap, "slicewise.events", settings.topic) == {}


@pytest.fixture
def acl_broker(tmp_path):
    """A broker whose SASL user `etl` may do only what an ACL grants it."""
    with running_broker(tmp_path / "broker", sasl_users={"etl": "etl-secret"}, acls=True) as broker:
        yield broker


def allow(admin: AdminClient, kind: ResourceType, name: str, *operations: AclOperation) -> None:
    bindings = [
        AclBinding(
            kind, name, ResourcePatternType.LITERAL, "User:etl", "*", op, AclPermissionType.ALLOW
        )
        for op in operations
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


def test_without_an_acl_for_the_group_the_publication_stands_and_says_so(
    acl_broker, tmp_path, capsys
):
    topic = "guarded-events"
    admin = AdminClient({"bootstrap.servers": acl_broker.bootstrap})  # a super user
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
    allow(admin, ResourceType.TOPIC, topic, AclOperation.READ, AclOperation.DESCRIBE)
    TxProducer({"bootstrap.servers": acl_broker.bootstrap}, topic, "tx-guarded").send(
        [Record(event_value(f"g{i}", T0 + 0.5 * HOUR), i % 2, T0 + 0.5 * HOUR) for i in range(4)]
    )
    settings = load_settings(
        {
            **os.environ,
            "SLICEWISE_KAFKA_BOOTSTRAP": f"127.0.0.1:{acl_broker.sasl_port}",
            "SLICEWISE_KAFKA_PROP_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "SLICEWISE_KAFKA_PROP_SASL_MECHANISM": "PLAIN",
            "SLICEWISE_KAFKA_PROP_SASL_USERNAME": "etl",
            "SLICEWISE_KAFKA_PROP_SASL_PASSWORD": "etl-secret",
            "SLICEWISE_TOPIC": topic,
            "SLICEWISE_STATE_DIR": str(tmp_path / "state"),
            "SLICEWISE_LAKEHOUSE": str(tmp_path / "lakehouse"),
        }
    )
    sl = plan_slice(settings, T0, T0 + HOUR, now=LATER)  # etl may read the topic
    ledger = Ledger.of(settings)
    # What acknowledge follows (its subject here is the broker's ACLs, not Spark): the
    # slice's publication as the ledger records it.
    ledger.record_step(sl.slice_id, "publish", {"silver_version": 0})

    refused = acknowledge(settings, ledger, sl)
    assert "Group authorization failed" in refused["warning"], refused
    assert "READ on group slicewise.events" in refused["warning"]
    cli.print_status(cli.status_rows(ledger, [sl]))
    assert "consumer group slicewise.events not moved: " in capsys.readouterr().out

    allow(admin, ResourceType.GROUP, "slicewise.events", AclOperation.READ)
    assert acknowledge(settings, ledger, sl) == {
        "group": "slicewise.events",
        "committed": sl.slice_id,
    }
    assert describe(acl_broker.bootstrap, "slicewise.events", topic) == {
        p: (sl.ranges[p][1], sl.ranges[p][1], 0) for p in range(2)
    }
