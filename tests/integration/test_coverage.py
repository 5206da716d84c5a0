"""Slices cover the topic (issue 93, findings 1 and 3), on the real broker and tables.

An interval the scheduler skipped (catchup off after an outage, a paused DAG) owns no
slice. Before, the runs around it published with every task green, the group committed
past it and `status` said nothing: silver held two hours of three. Now the publication
past it is refused naming the range and the command that repairs it, `status` names it,
the group stays below it, and once the interval runs everything lands exactly once.
And the group is walked from the ledger's own mark, never read back: once its offsets
expire it is set again below a slice waiting for an override, not past it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from test_consumer_group import consumer_groups, describe
from test_core import cli_env

from slicewise import acknowledge, cli
from slicewise.coverage import UnownedRange
from slicewise.gate import run_gate
from slicewise.ingest import run_ingest
from slicewise.ledger import Ledger
from slicewise.planner import plan_slice
from slicewise.publish import run_publish
from slicewise_dev.producer import Record, event_value

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(days=1)).replace(
    hour=0, minute=0, second=0, microsecond=0
)
HOUR = timedelta(hours=1)
LATER = datetime.now(timezone.utc) + timedelta(days=365)


def at(hour: int) -> datetime:
    return T0 + hour * HOUR


def send_hours(producer, hours: range, per_hour: int) -> None:
    producer.send(
        [
            Record(
                event_value(f"e{h}-{i}", at(h) + i * timedelta(seconds=30)),
                i % 3,
                at(h) + i * timedelta(seconds=30),
            )
            for h in hours
            for i in range(per_hour)
        ]
    )


def ingest_and_gate(spark, settings, hour: int):
    sl = plan_slice(settings, at(hour), at(hour + 1), now=LATER)
    run_ingest(spark, settings, sl.slice_id)
    run_gate(spark, settings, sl.slice_id)
    return sl


def status(monkeypatch, capsys, settings, kafka_bootstrap) -> str:
    cli_env(monkeypatch, settings, kafka_bootstrap)
    capsys.readouterr()
    assert cli.main(["status"]) == 0
    return capsys.readouterr().out


def test_a_skipped_interval_is_refused_and_named_and_an_expired_group_never_passes_a_slice(
    spark, pipeline_factory, kafka_bootstrap, monkeypatch, capsys
):
    # The walk before looked at the latest page of slices (20) when the group's offsets
    # named none; a page of one reaches that state with a few slices, not twenty-two.
    monkeypatch.setattr(acknowledge, "PAGE", 1, raising=False)
    settings, producer = pipeline_factory(SLICEWISE_PUBLISH_WAIT_SECONDS="0")
    group = settings.pipeline.consumer_group_name
    send_hours(producer, range(5), 60)

    # The scheduler ran hours 0 and 2 and skipped hour 1 (catchup off after an outage).
    first = ingest_and_gate(spark, settings, 0)
    run_publish(spark, settings, first.slice_id)
    later = ingest_and_gate(spark, settings, 2)
    with pytest.raises(UnownedRange) as refused:
        run_publish(spark, settings, later.slice_id)
    message = str(refused.value)
    assert f"[{at(1).isoformat()}, {at(2).isoformat()})" in message
    assert f"airflow backfill create --dag-id {settings.pipeline.dag_id}" in message
    assert f"slicewise plan --start {at(1).isoformat()} --end {at(2).isoformat()}" in message
    ledger = Ledger.of(settings)
    assert ledger.step(later.slice_id, "publish") is None  # nothing downstream changed
    assert offsets(kafka_bootstrap, group, settings) == ends(first)
    out = status(monkeypatch, capsys, settings, kafka_bootstrap)
    assert f"UNOWNED [{at(1).isoformat()}, {at(2).isoformat()})" in out

    # On-call runs the interval the refusal names, then clears the refused task.
    middle = ingest_and_gate(spark, settings, 1)
    run_publish(spark, settings, middle.slice_id)
    assert ledger.step(middle.slice_id, "acknowledge")["waits_for"] == later.slice_id
    run_publish(spark, settings, later.slice_id)
    silver = spark.read.format("delta").load(settings.table("silver"))
    assert silver.count() == silver.select("event_id").distinct().count() == 180
    assert offsets(kafka_bootstrap, group, settings) == ends(later)
    assert "UNOWNED" not in status(monkeypatch, capsys, settings, kafka_bootstrap)

    # Hour 3 is planned, but its ingest waits (a data-loss report awaiting its override);
    # hour 4 publishes, and the group stays below hour 3.
    waiting = plan_slice(settings, at(3), at(4), now=LATER)
    last = ingest_and_gate(spark, settings, 4)
    run_publish(spark, settings, last.slice_id)
    assert offsets(kafka_bootstrap, group, settings) == ends(later)

    # The group's offsets expire (offsets.retention.minutes), as Kafka's tool deletes them;
    # the next publication sets it again, below hour 3, not past it.
    consumer_groups(kafka_bootstrap, "--delete", "--group", group)
    assert describe(kafka_bootstrap, group, settings.topic) == {}
    run_publish(spark, settings, last.slice_id)  # a rerun, or the next slice's publication
    assert offsets(kafka_bootstrap, group, settings) == ends(later)
    assert ledger.step(last.slice_id, "acknowledge")["waits_for"] == waiting.slice_id

    run_ingest(spark, settings, waiting.slice_id)  # the override given, it lands
    run_gate(spark, settings, waiting.slice_id)
    run_publish(spark, settings, waiting.slice_id)
    assert offsets(kafka_bootstrap, group, settings) == ends(last)
    assert silver.count() == 300


def ends(sl) -> dict[int, int]:
    return {p: sl.ranges[p][1] for p in range(3)}


def offsets(bootstrap: str, group: str, settings) -> dict[int, int]:
    """The group's committed offset per partition, as `kafka-consumer-groups.sh` shows it."""
    return {p: row[0] for p, row in describe(bootstrap, group, settings.topic).items()}
