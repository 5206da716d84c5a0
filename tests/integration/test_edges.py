"""The promise at its edges, against a real broker and real Delta tables: a failed gate
holds every publication until it passes (write-audit-publish), a topic deleted and
recreated is refused and then read from its start, and a partition added before a
backfilled interval plans contiguous slices."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from pyspark.sql import functions as F

from slicewise import key_index
from slicewise.config import load_settings
from slicewise.faults import InjectedFault
from slicewise.gate import GateFailed, run_gate
from slicewise.ingest import run_ingest
from slicewise.kafka.consumer_group import ConsumerGroup
from slicewise.kafka.offsets import TopicOffsets, client_conf
from slicewise.ledger import Ledger
from slicewise.planner import CompactedTopic, plan_slice
from slicewise.publish import GateNotPassed, PublicationBlocked, run_publish
from slicewise.slices import TopicReset
from slicewise.spark import remote_session
from slicewise.tables import table_exists, table_version
from slicewise_dev.producer import Record, TxProducer, event_value

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(days=2)).replace(
    hour=0, minute=0, second=0, microsecond=0
)
LATER = datetime.now(timezone.utc) + timedelta(days=365)  # every test interval has closed

PIPELINE = """
pipelines:
  events:
    topic: {topic}
    key: [event_id]
    event_time: occurred_at
    fields:
      event_id: {{type: string, required: true}}
      event_type: {{type: string, required: true{rule}}}
      occurred_at: {{type: timestamp, required: true}}
      payload: {{type: object}}
    gold:
      group_by: [event_type]
"""


def definition(topic: str, expected: str | None = None, allowed: str | None = None) -> str:
    """The events pipeline on `topic`, with an expectation on event_type's values (the
    gate checks it) or a field rule (`allowed`: the parse quarantines the rest)."""
    text = PIPELINE.format(topic=topic, rule=f", allowed: {allowed}" if allowed else "")
    if expected:
        text += "    expectations:\n"
        text += f"      - expect_column_values_to_be_in_set: {{column: event_type, value_set: {expected}}}\n"
    return text


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def ev(event_id: str, hours: float, partition: int = 0, event_type: str = "click") -> Record:
    return Record(event_value(event_id, at(hours), event_type=event_type), partition, at(hours))


def gold_events(spark, settings) -> int:
    gold = spark.read.format("delta").load(settings.table("gold_events_per_hour"))
    return gold.agg(F.sum("events")).first()[0] or 0


def test_a_failed_gate_holds_every_publication_until_it_passes(
    spark, pipeline_factory, new_topic, tmp_path
):
    """Slice A fails a declared expectation; slice B an hour later passes its own gate
    but is not published (gold, the consumer group and the ledger's publication stay
    where they were) until A is repaired and passes; then both publish."""
    topic = new_topic(3)
    strict, relaxed = tmp_path / "strict.yaml", tmp_path / "relaxed.yaml"
    strict.write_text(definition(topic, expected="[click, view]"))
    relaxed.write_text(definition(topic, expected="[click, view, refund]"))
    settings, producer = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(strict))
    producer.send([ev(f"a-{i}", 0.1 + i / 100, i % 3) for i in range(20)])
    producer.send([ev(f"r-{i}", 0.5, i % 3, event_type="refund") for i in range(5)])
    producer.send([ev(f"b-{i}", 1.1 + i / 100, i % 3) for i in range(30)])
    ledger = Ledger.of(settings)

    a = plan_slice(settings, at(0), at(1), now=LATER)
    run_ingest(spark, settings, a.slice_id)
    with pytest.raises(GateFailed, match="no other slice publishes until this one passes"):
        run_gate(spark, settings, a.slice_id)
    b = plan_slice(settings, at(1), at(2), now=LATER)
    run_ingest(spark, settings, b.slice_id)
    assert run_gate(spark, settings, b.slice_id)["success"]
    with pytest.raises(PublicationBlocked, match=f"{a.slice_id} failed the gate") as blocked:
        run_publish(spark, settings, b.slice_id)
    assert "NOT published" in str(blocked.value)
    assert ledger.step(b.slice_id, "publish") is None
    assert not table_exists(spark, settings.table("gold_events_per_hour"))
    with ConsumerGroup(client_conf(settings), "slicewise.events", topic) as group:
        assert group.committed(range(3)) == {}

    # The repair: the definition now allows refunds; A's gate passes, both publish.
    relaxed_settings, _ = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(relaxed))
    repaired = replace(settings, pipeline=relaxed_settings.pipeline)
    assert run_gate(spark, repaired, a.slice_id)["success"]
    run_publish(spark, repaired, b.slice_id)
    assert gold_events(spark, settings) == 55  # B's window holds A's hour too
    run_publish(spark, repaired, a.slice_id)
    assert gold_events(spark, settings) == 55
    with ConsumerGroup(client_conf(settings), "slicewise.events", topic) as group:
        held = group.committed(range(3))
    assert {p: o for p, (o, _) in held.items()} == {p: hi for p, (_, hi) in b.ranges.items()}
    published = ledger.step(b.slice_id, "publish")
    silver_then = (
        spark.read.format("delta")
        .option("versionAsOf", published["silver_version"])
        .load(settings.table("silver"))
    )
    assert silver_then.where(F.col("event_id").startswith("b-")).count() == 30


def test_two_pipelines_on_one_topic_under_one_ledger_dir_keep_their_own_verdicts(
    spark, pipeline_factory, new_topic, tmp_path
):
    """`loose` without expectations and `strict` refusing refunds read one topic, with
    SLICEWISE_LEDGER_DIR set: loose's passing gate neither clears strict's verdict nor
    lets strict publish the refunds its gate rejected."""
    topic = new_topic(1)
    one = definition(topic)
    both = "pipelines:\n" + "".join(
        one.split("pipelines:\n", 1)[1].replace("  events:", f"  {name}:", 1)
        for name in ("loose", "strict")
    )
    both += "    expectations:\n"
    both += "      - expect_column_values_to_be_in_set: {column: event_type, value_set: [click]}\n"
    (tmp_path / "pipelines.yaml").write_text(both)
    base, producer = pipeline_factory(topic=topic)
    env = {
        **{k: v for k, v in os.environ.items() if k != "SLICEWISE_TOPIC"},
        "SLICEWISE_KAFKA_BOOTSTRAP": base.bootstrap_servers,
        "SLICEWISE_SPARK_REMOTE": base.spark_remote or "",
        "SLICEWISE_STATE_DIR": str(tmp_path / "state"),
        "SLICEWISE_LAKEHOUSE": str(tmp_path / "lakehouse"),
        "SLICEWISE_PIPELINES_FILE": str(tmp_path / "pipelines.yaml"),
        "SLICEWISE_LEDGER_DIR": str(tmp_path / "ledgers"),
    }
    loose, strict = (load_settings(env, pipeline=name) for name in ("loose", "strict"))
    assert strict.pipeline.expectations and not loose.pipeline.expectations
    producer.send([ev(f"c-{i}", 0.1 + i / 100) for i in range(20)])
    producer.send([ev(f"r-{i}", 0.5, event_type="refund") for i in range(5)])

    slices = {}
    for settings in (loose, strict):
        slices[settings.pipeline.name] = plan_slice(settings, at(0), at(1), now=LATER).slice_id
        run_ingest(spark, settings, slices[settings.pipeline.name])
    with pytest.raises(GateFailed):
        run_gate(spark, strict, slices["strict"])
    assert run_gate(spark, loose, slices["loose"])["success"]
    with pytest.raises(GateNotPassed, match="nothing was published"):
        run_publish(spark, strict, slices["strict"])
    assert not table_exists(spark, strict.table("gold_events_per_hour"))
    assert Ledger(strict.ledger_dir, topic).step(slices["strict"], "gate")["success"] is False
    run_publish(spark, loose, slices["loose"])
    assert gold_events(spark, loose) == 25
    assert loose.ledger_dir != strict.ledger_dir


def test_a_retried_ingest_never_lets_another_slice_publish_rows_no_gate_saw(
    spark, pipeline_factory, new_topic, tmp_path, monkeypatch
):
    """X (5 of its events break a declared expectation) MERGEs and dies before recording
    silver; Y, an hour later, merges and passes; X's retry runs. Y's publication must not
    carry X's rows: it waits for X's gate, and once that fails, is refused naming X."""
    topic = new_topic(3)
    strict = tmp_path / "strict.yaml"
    strict.write_text(definition(topic, expected="[click, view]"))
    settings, producer = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(strict))
    settings = replace(settings, publish_wait_seconds=3)
    producer.send([ev(f"x-{i}", 0.1 + i / 200, i % 3) for i in range(95)])
    producer.send([ev(f"r-{i}", 0.5, i % 3, event_type="refund") for i in range(5)])
    producer.send([ev(f"y-{i}", 1.1 + i / 100, i % 3) for i in range(30)])
    x = plan_slice(settings, at(0), at(1), now=LATER)
    y = plan_slice(settings, at(1), at(2), now=LATER)
    monkeypatch.setenv("SLICEWISE_FAULTS", "silver.merged")
    with pytest.raises(InjectedFault):
        run_ingest(spark, settings, x.slice_id)
    monkeypatch.delenv("SLICEWISE_FAULTS")
    run_ingest(spark, settings, y.slice_id)
    assert run_gate(spark, settings, y.slice_id)["success"]
    run_ingest(spark, settings, x.slice_id)  # the retry: its MERGE already committed
    with pytest.raises(PublicationBlocked, match=f"{x.slice_id} merged into silver but"):
        run_publish(spark, settings, y.slice_id)
    with pytest.raises(GateFailed):
        run_gate(spark, settings, x.slice_id)
    with pytest.raises(PublicationBlocked, match=f"{x.slice_id} failed the gate"):
        run_publish(spark, settings, y.slice_id)
    assert not table_exists(spark, settings.table("gold_events_per_hour"))
    with ConsumerGroup(client_conf(settings), "slicewise.events", topic) as group:
        assert group.committed(range(3)) == {}


def test_a_publication_waits_for_a_slice_merged_before_it(spark, pipeline):
    """Another slice merged before this one and its gate not run yet: publication waits
    (here past `publish_wait_seconds`) and names it, instead of publishing its rows."""
    settings, producer = pipeline
    settings = replace(settings, publish_wait_seconds=3)
    producer.send([ev(f"a-{i}", 0.2, i % 3) for i in range(4)])
    producer.send([ev(f"b-{i}", 1.2, i % 3) for i in range(4)])
    a = plan_slice(settings, at(0), at(1), now=LATER)
    b = plan_slice(settings, at(1), at(2), now=LATER)
    run_ingest(spark, settings, a.slice_id)
    run_ingest(spark, settings, b.slice_id)
    run_gate(spark, settings, b.slice_id)
    started = time.monotonic()
    with pytest.raises(PublicationBlocked, match=f"{a.slice_id} merged into silver but"):
        run_publish(spark, settings, b.slice_id)
    assert time.monotonic() - started >= 3
    run_gate(spark, settings, a.slice_id)
    publication = run_publish(spark, settings, b.slice_id)
    assert gold_events(spark, settings) == 8
    assert publication.silver_version >= 0


def test_a_publication_never_waits_for_a_slice_merged_after_it(spark, pipeline):
    """A merges, then B merges and its gate has not run; A's gate runs after B's MERGE.
    A's gate proves silver as of A's own commit, so A publishes at once, without B's
    rows (the first cut of the rule proved the version its gate started at, and A then
    waited for B: issue 66)."""
    settings, producer = pipeline
    settings = replace(settings, publish_wait_seconds=3)
    producer.send([ev(f"a-{i}", 0.2, i % 3) for i in range(4)])
    producer.send([ev(f"b-{i}", 1.2, i % 3) for i in range(6)])
    a = plan_slice(settings, at(0), at(1), now=LATER)
    b = plan_slice(settings, at(1), at(2), now=LATER)
    run_ingest(spark, settings, a.slice_id)
    run_ingest(spark, settings, b.slice_id)
    gate = run_gate(spark, settings, a.slice_id)
    assert gate["silver_version"] < table_version(spark, settings.table("silver"))
    publication = run_publish(spark, settings, a.slice_id)
    assert publication.silver_version == gate["silver_version"]
    assert gold_events(spark, settings) == 4


def test_a_publication_from_an_older_view_never_replaces_a_newer_one(spark, pipeline, monkeypatch):
    """A's publication takes its verified version (A's MERGE), then stalls before writing
    gold; B merges, passes and publishes gold's hours from the newer version, with A's
    rows and B's. A's write, from the older view, would put back hours without B's rows
    though B is recorded as published: gold's fence makes Delta skip it, and A rebuilds
    from the version gold was last built from."""
    import slicewise.publish as publish

    settings, producer = pipeline
    producer.send([ev(f"a-{i}", 0.2, i % 3) for i in range(4)])
    producer.send([ev(f"b-{i}", 1.2, i % 3) for i in range(6)])
    a = plan_slice(settings, at(0), at(1), now=LATER)
    b = plan_slice(settings, at(1), at(2), now=LATER)
    run_ingest(spark, settings, a.slice_id)
    assert run_gate(spark, settings, a.slice_id)["success"]
    stalled, go = threading.Event(), threading.Event()
    real = publish.silver_window

    def stall(spark_, settings_, reach, version):
        if threading.current_thread() is not threading.main_thread() and not go.is_set():
            stalled.set()
            assert go.wait(120)
        return real(spark_, settings_, reach, version)

    monkeypatch.setattr(publish, "silver_window", stall)
    with ThreadPoolExecutor(1) as pool:
        older = pool.submit(run_publish, spark, settings, a.slice_id)
        assert stalled.wait(300)
        run_ingest(spark, settings, b.slice_id)
        assert run_gate(spark, settings, b.slice_id)["success"]
        newer = run_publish(spark, settings, b.slice_id)
        assert gold_events(spark, settings) == 10
        go.set()
        publication = older.result(300)
    assert gold_events(spark, settings) == 10
    assert publication.silver_version >= newer.silver_version
    assert publication.gold_version > newer.gold_version


def recreate(admin: AdminClient, topic: str, partitions: int) -> None:
    """Delete `topic` and create it again under its name (Kafka gives it a new id)."""
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, -1)])[topic].result(timeout=30)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # the deletion is still under way
    while any(p.leader < 0 for p in admin.list_topics(topic).topics[topic].partitions.values()):
        time.sleep(0.1)


def test_a_recreated_topic_is_refused_then_read_from_its_start(spark, pipeline, kafka_bootstrap):
    settings, producer = pipeline
    producer.send([ev(f"old-{i}", 0.2 + i / 100, i % 3) for i in range(30)])
    first = plan_slice(settings, at(0), at(1), now=LATER)
    frozen = plan_slice(settings, at(1), at(2), now=LATER)  # frozen, never ingested
    run_ingest(spark, settings, first.slice_id)

    recreate(AdminClient(client_conf(settings)), settings.topic, 3)
    fresh = TxProducer(client_conf(settings), settings.topic, f"tx-{settings.topic}-fresh")
    fresh.send([ev(f"new-{i}", 1.5 + i / 100, i % 3) for i in range(12)])
    fresh.send([ev(f"next-{i}", 2.5, i % 3) for i in range(6)])

    # The slice frozen in the old topic: its offsets would read the new topic's records.
    with pytest.raises(TopicReset, match="no longer the log this slice was frozen in"):
        run_ingest(spark, settings, frozen.slice_id)
    # A slice bronze holds is retried from bronze's copy: nothing lost, nothing refused.
    again = run_ingest(spark, settings, first.slice_id)
    assert (again.bronze.rows, again.bronze.committed) == (30, False)
    # A new interval: refused, naming the new id, until the override.
    with pytest.raises(TopicReset, match="the topic's id is"):
        plan_slice(settings, at(2), at(3), now=LATER)
    reset = plan_slice(settings, at(2), at(3), now=LATER, accept_topic_reset=True)
    assert all(frm == 0 for frm, _ in reset.ranges.values())
    assert plan_slice(settings, at(2), at(3), now=LATER) == reset  # frozen, as any slice
    ledger = Ledger.of(settings)
    assert [e["epoch"] for e in ledger.epochs()] == [1]
    assert ledger.step(reset.slice_id, "topic_reset_ack")["epoch"] == 1
    run_ingest(spark, settings, reset.slice_id)
    silver = spark.read.format("delta").load(settings.table("silver"))
    ids = {r.event_id for r in silver.select("event_id").collect()}
    assert {f"new-{i}" for i in range(12)} <= ids  # before the interval, in the new log
    assert {f"next-{i}" for i in range(6)} <= ids
    assert len(ids) == 30 + 18
    # The old slice goes on only with the data-loss override, as lost.
    run_ingest(spark, settings, frozen.slice_id, accept_data_loss=True)
    assert ledger.step(frozen.slice_id, "data_loss_ack")["topic_reset"]
    assert silver.count() == 48
    # Later intervals plan in the new epoch without the override.
    assert plan_slice(settings, at(3), at(4), now=LATER).ranges


def test_a_partition_added_then_an_earlier_interval_backfilled(spark, pipeline_factory, new_topic):
    """Hour 2 is planned while the topic has one partition; a second is added and gets
    records of hours 0 and 2; hour 0 is then backfilled. Its boundaries must agree with
    hour 2's (where partition 1 did not exist, so begins at 0): every record of
    partition 1 is owned by exactly one slice, and no plan is refused."""
    topic = new_topic(1)
    settings, producer = pipeline_factory(topic=topic)
    producer.send([ev("p0-a", 0.5), ev("p0-b", 2.5)])
    later = plan_slice(settings, at(2), at(3), now=LATER)
    admin = AdminClient(client_conf(settings))
    admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
    grown = TxProducer(client_conf(settings), topic, f"tx-{topic}-grown")  # sees partition 1
    grown.send([ev("p1-a", 0.5, 1), ev("p1-b", 2.5, 1)])
    slices = [plan_slice(settings, at(h), at(h + 1), now=LATER) for h in (0, 1, 3)]
    owned = [o for sl in [later, *slices] for o in range(*sl.ranges.get(1, (0, 0)))]
    end = TopicOffsets.of(settings).last_stable([1])[1]  # two records and the commit marker
    assert sorted(owned) == list(range(end)) and end == 3
    for sl in [later, *slices]:
        run_ingest(spark, settings, sl.slice_id)
    silver = spark.read.format("delta").load(settings.table("silver"))
    assert sorted(r.event_id for r in silver.collect()) == ["p0-a", "p0-b", "p1-a", "p1-b"]


def test_two_concurrent_backfill_plans_store_boundaries_that_agree(pipeline, monkeypatch):
    """Two planners resolve new boundaries beyond the newest one at once (hours 2, and
    3 and 4), while a back-dated record moves an idle partition's LSO between their
    reads. Without one planner at a time, the hour-2 boundary lands above hour 3's
    on that partition and neither interval can ever be planned again."""
    settings, producer = pipeline
    producer.send([ev(f"p0-{h}", h + 0.5) for h in range(6)])  # partitions 1 and 2 idle
    plan_slice(settings, at(0), at(1), now=LATER)
    paused, released = threading.Event(), threading.Event()
    real = TopicOffsets.snapshot

    def snapshot(self, when):
        if when == at(2):  # planner A has read its neighbours: hold it here
            paused.set()
            released.wait(30)
        return real(self, when)

    monkeypatch.setattr(TopicOffsets, "snapshot", snapshot)
    results: dict[str, object] = {}

    def plan(name: str, start: int, end: int) -> None:
        try:
            results[name] = plan_slice(settings, at(start), at(end), now=LATER)
        except Exception as exc:
            results[name] = exc

    a = threading.Thread(target=plan, args=("a", 1, 2))
    a.start()
    assert paused.wait(30)
    b = threading.Thread(target=plan, args=("b", 3, 4))
    b.start()
    b.join(timeout=5)  # planner B runs now, or waits for A's lease
    producer.send([ev("late", 0.2, 2)])  # back-dated: only partition 2's LSO moves
    released.set()
    a.join(60)
    b.join(60)
    assert not [r for r in results.values() if isinstance(r, Exception)], results
    slices = [plan_slice(settings, at(h), at(h + 1), now=LATER) for h in range(4)]
    for p in range(3):
        owned = [o for sl in slices for o in range(*sl.ranges[p])]
        assert owned == list(range(slices[0].ranges[p][0], slices[-1].ranges[p][1]))
    assert sum(sl.ranges[2][1] - sl.ranges[2][0] for sl in slices) == 2  # the record, its marker


def test_a_compacted_topic_is_read_only_when_the_definition_says_what_tombstones_are(
    spark, pipeline_factory, new_topic, tmp_path
):
    topic = new_topic(1, config={"cleanup.policy": "compact", "retention.ms": "-1"})
    plain, declared = tmp_path / "plain.yaml", tmp_path / "declared.yaml"
    text = definition(topic, expected="[click]")
    plain.write_text(text)
    declared.write_text(text + "    tombstones: quarantine\n")
    settings, producer = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(plain))
    live = Record(event_value("k1", at(0.2)), 0, at(0.2), key=b"k1")
    producer.send([live, Record(None, 0, at(0.3), key=b"k2")])
    with pytest.raises(CompactedTopic, match="cleanup.policy=compact"):
        plan_slice(settings, at(0), at(1), now=LATER)
    settings, _ = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(declared))
    sl = plan_slice(settings, at(0), at(1), now=LATER)
    run_ingest(spark, settings, sl.slice_id)
    quarantine = spark.read.format("delta").load(settings.table("quarantine"))
    assert [r.reason for r in quarantine.collect()] == ["null_value"]
    assert spark.read.format("delta").load(settings.table("silver")).count() == 1


def published_hours(spark, settings, hours: int) -> list:
    """Hours 0 .. hours-1 planned, ingested, gated and published, in turn."""
    slices = [plan_slice(settings, at(h), at(h + 1), now=LATER) for h in range(hours)]
    for sl in slices:
        run_ingest(spark, settings, sl.slice_id)
        run_gate(spark, settings, sl.slice_id)
        run_publish(spark, settings, sl.slice_id)
    return slices


def test_a_replay_under_stricter_rules_withdraws_what_it_now_quarantines(
    spark, pipeline_factory, new_topic, tmp_path, monkeypatch
):
    """Views become not allowed. The replay of hour 0 quarantines its views; they leave
    silver and gold. Where hour 1 holds another copy of one (a click, beaten by hour
    0's position until now), that copy takes its place; where hour 0 holds one itself
    (`d`: a view, then a click at a later position), its click does, though the key
    stayed valid. The first replay is cut off after its withdrawal (the views' rows
    gone, no copy in their place yet); run again, it ends as if it had run once. Both
    gates pass."""
    import slicewise.replay as replay

    topic = new_topic(3)
    broad, narrow = tmp_path / "broad.yaml", tmp_path / "narrow.yaml"
    broad.write_text(definition(topic, allowed="[click, view]"))
    narrow.write_text(definition(topic, allowed="[click]"))
    settings, producer = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(broad))
    producer.send([ev(f"c-{i}", 0.1 + i / 100, 0) for i in range(4)])
    producer.send([ev(f"v-{i}", 0.3, 0, event_type="view") for i in range(2)])
    producer.send([ev("d", 0.4, 0, event_type="view"), ev("d", 0.5, 0)])
    producer.send([ev("v-0", 1.2, 2)])  # a later copy, a click, at a later position
    a, b = published_hours(spark, settings, 2)
    assert gold_events(spark, settings) == 7

    stricter, _ = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(narrow))
    stricter = replace(settings, pipeline=stricter.pipeline)

    def cut_off(*args, **kwargs):
        raise InjectedFault("the replay is cut off after its withdrawal")

    with monkeypatch.context() as cut:
        cut.setattr(replay, "other_copies", cut_off)
        with pytest.raises(InjectedFault):
            replay.run_replay(spark, stricter, a.slice_id)
    silver = spark.read.format("delta").load(settings.table("silver"))
    assert {r.event_id for r in silver.collect()} == {f"c-{i}" for i in range(4)}

    counts = replay.run_replay(spark, stricter, a.slice_id)
    assert (counts.quarantined, counts.inserted, counts.missing) == (3, 5, 0)
    silver = spark.read.format("delta").load(settings.table("silver"))
    rows = {r.event_id: (r.event_type, r.kafka_partition) for r in silver.collect()}
    assert rows == {
        **{f"c-{i}": ("click", 0) for i in range(4)},
        "v-0": ("click", 2),
        "d": ("click", 0),
    }
    quarantine = spark.read.format("delta").load(settings.table("quarantine"))
    quarantined = {(r.partition, r.offset) for r in quarantine.collect()}
    assert len(quarantined) == 3  # the three views
    assert not quarantined & {(r.kafka_partition, r.kafka_offset) for r in silver.collect()}
    assert run_gate(spark, stricter, a.slice_id)["success"]
    assert run_gate(spark, stricter, b.slice_id)["success"]
    run_publish(spark, stricter, a.slice_id)
    gold = spark.read.format("delta").load(settings.table("gold_events_per_hour"))
    assert {
        r.event_type: r.total
        for r in gold.groupBy("event_type").agg(F.sum("events").alias("total")).collect()
    } == {"click": 6}
    ledger = Ledger.of(settings)
    assert ledger.step(a.slice_id, "replay")["changed"]
    assert replay.run_replay(spark, stricter, a.slice_id) == counts  # safe to repeat


def test_a_stricter_replay_refuses_when_a_keys_other_copy_lost_its_bronze(
    spark, pipeline_factory, new_topic, tmp_path
):
    """Hour 1's view of `k` beats hour 0's click (a lower partition); views become not
    allowed, and retention dropped hour 0's bronze rows. The click cannot take the
    view's place, so the replay of hour 1 refuses before any write, naming hour 0: `k`
    stays in silver as it was."""
    from slicewise.maintenance import drop_old_bronze
    from slicewise.replay import ReplayRefused, run_replay

    topic = new_topic(3)
    broad, narrow = tmp_path / "broad.yaml", tmp_path / "narrow.yaml"
    broad.write_text(definition(topic, allowed="[click, view]"))
    narrow.write_text(definition(topic, allowed="[click]"))
    settings, producer = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(broad))
    producer.send([ev("k", 0.3, 2)])
    producer.send([ev("k", 1.2, 0, event_type="view"), ev("own", 1.4, 0)])
    old, replayed = published_hours(spark, settings, 2)
    dropped, _ = drop_old_bronze(spark, settings.table("bronze"), Ledger.of(settings), at(1))
    assert dropped == [old.slice_id]
    stricter, _ = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(narrow))
    stricter = replace(settings, pipeline=stricter.pipeline)
    before = {t: table_version(spark, settings.table(t)) for t in ("silver", "quarantine")}
    with pytest.raises(ReplayRefused, match=f"{old.slice_id}.*Nothing was written"):
        run_replay(spark, stricter, replayed.slice_id)
    assert {t: table_version(spark, settings.table(t)) for t in before} == before
    silver = spark.read.format("delta").load(settings.table("silver"))
    assert {(r.event_id, r.event_type) for r in silver.collect()} == {
        ("k", "view"),
        ("own", "click"),
    }


PUBLISHED = (2, 0, 1)  # T0's copy published, then A's moves the row 40 days back


def test_copies_far_apart_racing_end_as_one_row(
    spark, pipeline_factory, new_topic, tmp_path, monkeypatch
):
    """Hour 1 (S) records its ids and looks up far dates (none yet), then waits before its
    MERGE; hour 0 (X, a copy of `k` 20 days earlier) records its ids, finds S's date,
    and MERGEs first at its own date. S's MERGE read only its own window, so Delta sees
    no conflict and inserts `k` at S's date: two rows. S's lookup after its MERGE finds
    X's date and keeps the survivor (X's copy, at the lower position); both gates pass,
    and both publish."""
    import slicewise.silver as silver

    topic = new_topic(1)
    spec = tmp_path / "events.yaml"
    spec.write_text(definition(topic))
    settings, producer = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(spec))
    producer.send([Record(event_value("k", T0 - timedelta(days=20)), 0, at(0.5))])
    producer.send([Record(event_value("k", T0), 0, at(1.5)), ev("own", 1.6)])
    x, s = (plan_slice(settings, at(h), at(h + 1), now=LATER) for h in (0, 1))
    looked_up, go = threading.Event(), threading.Event()
    real = silver.fault_point

    def hold(point, settings_, slice_id):
        if point == "silver.merging" and slice_id == s.slice_id:
            looked_up.set()
            assert go.wait(120)
        real(point, settings_, slice_id)

    monkeypatch.setattr(silver, "fault_point", hold)
    with ThreadPoolExecutor(1) as pool:
        racing = pool.submit(run_ingest, spark, settings, s.slice_id)
        assert looked_up.wait(300)
        run_ingest(spark, settings, x.slice_id)
        go.set()
        racing.result(300)
    silver_rows = spark.read.format("delta").load(settings.table("silver"))
    rows = sorted((r.event_id, r.kafka_offset) for r in silver_rows.collect())
    assert [r for r in rows if r[0] == "k"] == [("k", 0)]
    for sl in (x, s):  # X's last commit is S's clean-up, so its publication needs S's gate
        assert run_gate(spark, settings, sl.slice_id)["success"]
    for sl in (x, s):
        run_publish(spark, settings, sl.slice_id)
    assert gold_events(spark, settings) == 2


def test_a_copy_stored_twice_by_a_merge_ends_as_one_row(
    spark, pipeline_factory, new_topic, tmp_path, monkeypatch
):
    """A (hour 1, a copy of `k` 40 days back) and C (hour 2, one today) race: C records
    its ids and looks up far dates (none yet), then waits before its MERGE; A finds C's
    date, MERGEs first at its own, and C's MERGE, which read only its own window, stores
    `k` a second time. Before C's clean-up runs, Z (hour 0, the lowest position, a copy
    20 days back, with keys of its own at both ends so that its window holds both
    rows) MERGEs: Delta updates both rows with Z's copy, the same copy stored twice.
    Z's clean-up must keep that copy once (deleting by position took both rows: the key
    was lost), C's gate, which proves silver at C's own commit where `k` had two rows,
    must pass on silver as it is now, and every slice publishes `k` once."""
    import slicewise.gate_facts as gate_facts
    import slicewise.silver as silver
    from slicewise.windows import reach_of

    topic = new_topic(1)
    spec = tmp_path / "events.yaml"
    spec.write_text(definition(topic))
    settings, producer = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(spec))
    producer.send(
        [
            Record(event_value("k", T0 - timedelta(days=20)), 0, at(0.5)),
            Record(event_value("z-early", T0 - timedelta(days=40)), 0, at(0.6)),
            Record(event_value("z-late", T0), 0, at(0.7)),
        ]
    )
    producer.send([Record(event_value("k", T0 - timedelta(days=40)), 0, at(1.5))])
    producer.send([Record(event_value("k", T0), 0, at(2.5))])
    z, a, c = (plan_slice(settings, at(h), at(h + 1), now=LATER) for h in (0, 1, 2))
    at_point = {p: (threading.Event(), threading.Event()) for p in ("merging", "merged")}
    real = silver.fault_point

    def hold(point, settings_, slice_id):
        if slice_id == c.slice_id and point.startswith("silver."):
            reached, go = at_point.get(point.split(".")[1], (None, None))
            if reached is not None:
                reached.set()
                assert go.wait(300)
        real(point, settings_, slice_id)

    monkeypatch.setattr(silver, "fault_point", hold)
    with ThreadPoolExecutor(1) as pool:
        racing = pool.submit(run_ingest, spark, settings, c.slice_id)
        assert at_point["merging"][0].wait(300)
        run_ingest(spark, settings, a.slice_id)
        at_point["merging"][1].set()
        assert at_point["merged"][0].wait(300)
        stored = spark.read.format("delta").load(settings.table("silver"))
        assert stored.where("event_id = 'k'").count() == 2  # the race stored `k` twice
        run_ingest(spark, settings, z.slice_id)
        at_point["merged"][1].set()
        racing.result(300)
    silver_rows = spark.read.format("delta").load(settings.table("silver"))
    rows = sorted((r.event_id, r.kafka_offset) for r in silver_rows.collect())
    assert rows == [("k", 0), ("z-early", 1), ("z-late", 2)]
    lookups = []
    monkeypatch.setattr(gate_facts, "reach_of", lambda *args: lookups.append(1) or reach_of(*args))
    for sl, looked_up in ((z, True), (a, False), (c, True)):
        lookups.clear()
        assert run_gate(spark, settings, sl.slice_id)["success"], sl.slice_id
        # A's gate proves silver at its MERGE, below the version its ingest read before
        # its lookup: that reach holds. Z's last commit is its clean-up, above it; C's
        # gate falls back to silver as it is now: both look the far dates up again.
        assert bool(lookups) == looked_up, sl.slice_id
    for sl in (z, a, c):
        run_publish(spark, settings, sl.slice_id)
    assert gold_events(spark, settings) == 3


def test_copies_far_apart_end_as_one_row_in_any_order(
    spark_remote, pipeline_factory, new_topic, tmp_path
):
    """Three copies of a key whose event times lie 20 days apart (beyond the 7-day
    horizon), one in each of three slices: in whichever order the slices run (each
    slice planned, ingested and gated before the next), every gate passes and silver
    ends with one row for the key, the copy at the lowest Kafka position. The three
    rotations of the order put each copy first, in the middle and last once, so the
    survivor arrives first, between the others and after both (the other three orders
    repeat those cases). In the order where a later slice moves the row out of a
    published date (the latest copy first), each slice is also published: gold counts
    the key once. The orders run side by side, each in its own session and lakehouse
    (as pipelines on one server). The published order looks far dates up by a scan of
    `slice_ids`; the first order through the key index built after its first slice
    (later slices in its tail); the last through the index refreshed after each slice
    (copies in its runs)."""
    topic = new_topic(1)
    spec = tmp_path / "events.yaml"
    spec.write_text(definition(topic))
    far = [T0 - timedelta(days=40), T0 - timedelta(days=20), T0]
    _, producer = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(spec))
    for i, occurred in enumerate(far):  # slice i: the copy of `k`, then a key of its own
        producer.send([Record(event_value("k", occurred), 0, at(i + 0.5))])
        producer.send([ev(f"own-{i}", i + 0.6)])
    orders = [(0, 1, 2), PUBLISHED, (1, 2, 0)]
    runs = [pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(spec))[0] for _ in orders]

    def run(order: tuple[int, ...], settings) -> tuple:
        session = remote_session(spark_remote, fresh=True)
        try:
            slices = [plan_slice(settings, at(i), at(i + 1), now=LATER).slice_id for i in range(3)]
            for n, i in enumerate(order):
                run_ingest(session, settings, slices[i])
                assert run_gate(session, settings, slices[i])["success"], order
                if order == PUBLISHED:
                    run_publish(session, settings, slices[i])
                elif n == 0 or order == (1, 2, 0):
                    key_index.refresh(session, settings)
            silver = session.read.format("delta").load(settings.table("silver"))
            rows = sorted((r.event_id, r.occurred_at, r.kafka_offset) for r in silver.collect())
            gold = gold_events(session, settings) if order == PUBLISHED else len(rows)
            return order, tuple(rows), gold
        finally:
            session.stop()

    with ThreadPoolExecutor(len(orders)) as pool:
        outcomes = list(pool.map(run, orders, runs))
    for order, rows, gold in outcomes:
        assert [r for r in rows if r[0] == "k"] == [("k", far[0].replace(tzinfo=None), 0)], order
        assert gold == len(rows) == 4, order
    assert len({rows for _, rows, _ in outcomes}) == 1


def test_a_late_event_reaches_its_own_date_not_the_year_before_it(
    spark, pipeline_factory, new_topic, tmp_path
):
    """A slice of today's events and one a year late: its MERGE, gate and gold rebuild
    read those two dates (and the far dates of its keys), not the year of silver between
    them. An earlier slice's rows 100 days back stay unread; a copy of one of its keys
    there makes that date far for the later slice, and the key ends as one row."""
    topic = new_topic(1)
    spec = tmp_path / "events.yaml"
    spec.write_text(definition(topic))
    settings, producer = pipeline_factory(topic=topic, SLICEWISE_PIPELINES_FILE=str(spec))
    year_ago, between = T0 - timedelta(days=365), T0 - timedelta(days=100)
    producer.send(
        [
            Record(event_value("between", between), 0, at(0.5)),
            Record(event_value("copied", between), 0, at(0.6)),
        ]
    )
    producer.send(
        [
            ev("today", 1.5),
            Record(event_value("late", year_ago), 0, at(1.6)),
            Record(event_value("copied", T0), 0, at(1.7)),
        ]
    )
    first, second = (plan_slice(settings, at(h), at(h + 1), now=LATER) for h in (0, 1))
    ledger = Ledger.of(settings)
    for sl in (first, second):
        run_ingest(spark, settings, sl.slice_id)
        assert run_gate(spark, settings, sl.slice_id)["success"], sl.slice_id
        run_publish(spark, settings, sl.slice_id)
    expected = {
        "window": [T0.date().isoformat()] * 2,
        "far_dates": [year_ago.date().isoformat(), between.date().isoformat()],
    }
    silver_step = ledger.step(second.slice_id, "silver")
    assert {k: silver_step[k] for k in expected} == expected
    assert ledger.step(second.slice_id, "gate")["reach"] == expected
    rows = spark.read.format("delta").load(settings.table("silver")).collect()
    assert sorted((r.event_id, r.event_date) for r in rows) == [
        ("between", between.date()),
        ("copied", between.date()),  # the lower Kafka position survives
        ("late", year_ago.date()),
        ("today", T0.date()),
    ]
    assert gold_events(spark, settings) == 4
