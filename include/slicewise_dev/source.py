"""The event source: a realistic, faulty stream, and an oracle of what it really committed.

The one event generator of the dev stack: the demo, the tests, the chaos suite and
the bench all produce through `produce()`.

    slicewise-produce --start 2026-11-22T00:00:00Z --intervals 3 --events 600 \\
        --duplicate-rate 0.05 --aborted-rate 0.1 --malformed-rate 0.02 \\
        --open-transactions 1 --skew-minutes 20 --drift-rate 0.05 --manifest oracle.json

Every record goes through an idempotent, transactional producer. Faults on
request: duplicates (an event_id sent again later, to the same or another
partition, possibly in a later interval), aborted transactions, long-open
transactions (opened first, committed after everything else), malformed
payloads (including fields that changed type), valid events with a field the
contract does not know (schema drift), and Kafka timestamps skewed away from
`occurred_at`. The manifest is the yardstick for the pipeline: the keys
committed and valid, the aborted ones, and the exact (partition, offset) of every
malformed record.

Three shapes of events (`--shape`): `events`, the example pipeline's (a string
`event_id`), and `orders`, keyed on (`tenant`, `order.id`), a nested field, with
an epoch-millisecond `created_at` (the definition in docs/PIPELINES.md). In the
manifest an order's key is `tenant|order_id`; half of the order ids exist under
two tenants, so a key of the order id alone would merge distinct orders.
`avro-events` are the `events` in Avro, in the Confluent wire format, with their
schemas in the registry at SLICEWISE_SCHEMA_REGISTRY_URL (docs/examples/avro-events.yaml):
the first half of the stream is written with version 1, the second with version 2,
registered when the first record needs it (a new optional field, `channel`: a
compatible evolution mid-stream); the malformed records break the wire format.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from slicewise.cli import instant
from slicewise.config import Settings, load_settings
from slicewise_dev.producer import Record, TxProducer, avro_value, ensure_topic, event_value
from slicewise_dev.registry import register

MALFORMED = [
    b"{not json",
    b"[1, 2, 3]",
    b'{"event_type": "click"}',
    b'{"event_id": "  ", "event_type": "x"}',
    b'{"event_id": 42, "event_type": "x", "occurred_at": "2026-01-01T00:00:00Z"}',
    b'{"event_id": "m", "event_type": "x", "occurred_at": "2026-01-01 00:00"}',
    b"\xff\xfe",
    # Schema drift that breaks the contract: a field changed its type.
    b'{"event_id": "t1", "event_type": "x", "occurred_at": 1795390000}',
    b'{"event_id": "t2", "event_type": "x", "occurred_at": "2026-01-01T00:00:00Z", "payload": "s"}',
]
TYPES = ["page_view", "click", "purchase", "signup"]
STATUSES = ["placed", "paid", "shipped", "cancelled"]
ORDERS_MALFORMED = [
    b"{not json",
    b'{"order": {"id": "x", "amount": 1}, "status": "paid", "created_at": 1795390000000}',
    b'{"tenant": "t0", "order": {"id": 7, "amount": 1}, "status": "paid", "created_at": 1}',
    b'{"tenant": "t0", "order": {"id": "x", "amount": 1}, "status": "lost", "created_at": 1}',
    b'{"tenant": "t0", "order": {"id": "x", "amount": "1"}, "status": "paid", "created_at": 1}',
    b'{"tenant": "t0", "order": {"id": "x", "amount": 1}, "status": "paid", "created_at": "now"}',
    b'{"tenant": " ", "order": {"id": "x", "amount": 1}, "status": "paid", "created_at": 1}',
]


@dataclass(frozen=True)
class Shape:
    """What the source's events look like: their key in the manifest, their value."""

    name: str
    key: Callable[[str, int], str]  # (batch prefix, n) -> the key
    value: Callable[[str, datetime, random.Random], bytes]
    malformed: list[bytes]


def _event(key: str, at: datetime, rng: random.Random) -> bytes:
    return event_value(key, at, rng.choice(TYPES), {"n": rng.randint(1, 500)})


def _order(key: str, at: datetime, rng: random.Random) -> bytes:
    tenant, order_id = key.split("|")
    return json.dumps(
        {
            "tenant": tenant,
            "order": {"id": order_id, "amount": round(rng.uniform(1, 500), 2)},
            "status": rng.choice(STATUSES),
            "created_at": int(at.timestamp() * 1000),
        }
    ).encode()


SHAPES = {
    "events": Shape("events", lambda prefix, n: f"{prefix}-{n}", _event, MALFORMED),
    # Two tenants share each order id: only the composite key tells the orders apart.
    "orders": Shape(
        "orders", lambda prefix, n: f"t{n % 2}|o-{prefix}-{n // 2}", _order, ORDERS_MALFORMED
    ),
}


EVENT_V1 = {
    "type": "record",
    "name": "Event",
    "namespace": "slicewise.example",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "event_type", "type": "string"},
        {"name": "occurred_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "payload", "type": ["null", {"type": "map", "values": "long"}], "default": None},
    ],
}
EVENT_V2 = {
    **EVENT_V1,
    "fields": [
        *EVENT_V1["fields"],
        {"name": "channel", "type": ["null", "string"], "default": None},
    ],
}
CHANNELS = ["web", "ios", "android"]


def avro_events(settings: Settings, switch_at: datetime) -> Shape:
    """`events` in Avro: version 1 before `switch_at`, version 2 from then on."""
    if settings.schema_registry is None:
        raise ValueError("avro-events need a pipeline with format: avro and its registry")
    url, subject = settings.schema_registry.url, settings.schema_subject
    ids = {1: register(url, subject, EVENT_V1)}

    def value(key: str, at: datetime, rng: random.Random) -> bytes:
        event = {
            "event_id": key,
            "event_type": rng.choice(TYPES),
            "occurred_at": int(at.timestamp() * 1000),
            "payload": {"n": rng.randint(1, 500)},
        }
        if at < switch_at:
            return avro_value(ids[1], EVENT_V1, event)
        if 2 not in ids:  # the producers upgrade: the registry checks the new version
            ids[2] = register(url, subject, EVENT_V2)
        return avro_value(ids[2], EVENT_V2, {**event, "channel": rng.choice(CHANNELS)})

    at = int(switch_at.timestamp() * 1000)
    malformed = [
        b'{"event_id": "json", "event_type": "x"}',  # not_wire_format
        b"\x00\x00",  # not_wire_format: too short
        # unknown_schema_id: an id the registry never gave
        avro_value(2**31 - 1, EVENT_V1, {"event_id": "u", "event_type": "x", "occurred_at": at}),
        b"\x00" + ids[1].to_bytes(4, "big") + b"\x02",  # undecodable: cut off in event_id
        avro_value(ids[1], EVENT_V1, {"event_id": " ", "event_type": "x", "occurred_at": at}),
    ]
    return Shape("avro-events", SHAPES["events"].key, value, malformed)


@dataclass
class Manifest:
    topic: str
    committed_valid: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    malformed: set[tuple[int, int]] = field(default_factory=set)
    records_sent: int = 0
    duplicates_sent: int = 0

    def to_json(self) -> str:
        doc = asdict(self)
        for key in ("committed_valid", "aborted", "malformed"):
            doc[key] = sorted(doc[key])
        return json.dumps(doc, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        doc = json.loads(text)
        doc["committed_valid"] = set(doc["committed_valid"])
        doc["aborted"] = set(doc["aborted"])
        doc["malformed"] = {tuple(m) for m in doc["malformed"]}
        return cls(**doc)


@dataclass(frozen=True)
class Faults:
    duplicate_rate: float = 0.05
    aborted_rate: float = 0.1
    malformed_rate: float = 0.02
    open_transactions: int = 1
    skew_minutes: int = 0
    drift_rate: float = 0.0  # valid events that carry a field the contract does not know


def produce(
    settings: Settings,
    start: datetime,
    intervals: int,
    events: int,
    faults: Faults,
    partitions: int = 3,
    rate: float = 0.0,
    seed: int = 0,
    batch: int = 50,
    shape: str = "events",
    interval: timedelta = timedelta(hours=1),
    id_prefix: str = "",
) -> Manifest:
    """Send `events` new events spread over `intervals` intervals (hours by default) from
    `start`; return the oracle. `id_prefix` keeps the ids of several calls on one topic
    apart (each call's are otherwise the same)."""
    rng = random.Random(seed)
    if shape == "avro-events":
        kind = avro_events(settings, start + intervals * interval / 2)
    else:
        kind = SHAPES[shape]
    conf = {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka_props}
    ensure_topic(conf, settings.topic, partitions)
    manifest = Manifest(settings.topic)
    run = f"{seed}-{time.time_ns()}"  # transactional ids of one run never fence another's
    main = TxProducer(conf, settings.topic, f"source-{run}")

    def record(event_id: str, at: datetime) -> Record:
        skew = timedelta(minutes=rng.uniform(-1, 1) * faults.skew_minutes)
        value = kind.value(event_id, at, rng)
        drifted = (
            faults.drift_rate and kind.name != "avro-events" and rng.random() < faults.drift_rate
        )
        if drifted:  # schema drift that stays within the contract: a new field
            value = json.dumps({**json.loads(value), "schema_version": 2}).encode()
        return Record(
            value,
            rng.randrange(partitions),
            at + skew,  # Kafka's timestamp, which decides the slice
            key=event_id.encode(),  # an order's Kafka key: tenant|order_id
        )

    def at_random(k: int) -> datetime:
        return (
            start + k * interval + timedelta(seconds=rng.randrange(int(interval.total_seconds())))
        )

    def malformed_at(rec: Record, partition: int, offset: int) -> None:
        manifest.malformed.add((partition, offset))

    late: list[tuple[TxProducer, set[str]]] = []
    for i in range(faults.open_transactions):  # opened first, committed last
        ids = {kind.key(f"{id_prefix}late-{i}", j) for j in range(10)}
        producer = TxProducer(conf, settings.topic, f"source-{run}-late-{i}")
        producer.begin([record(e, at_random(0)) for e in sorted(ids)])
        manifest.records_sent += len(ids)
        late.append((producer, ids))

    sent: list[str] = []
    per_interval = max(1, events // intervals)
    for k in range(intervals):
        for first in range(0, per_interval, batch):
            ids = [
                kind.key(f"{id_prefix}evt-{k}", n)
                for n in range(first, min(first + batch, per_interval))
            ]
            records = [record(e, at_random(k)) for e in ids]
            repeats = sum(rng.random() < faults.duplicate_rate for _ in ids)
            again = rng.sample(sent, min(repeats, len(sent)))
            records += [record(e, at_random(k)) for e in again]  # same id, later, any partition
            bad = [
                Record(rng.choice(kind.malformed), rng.randrange(partitions), at_random(k))
                for _ in ids
                if rng.random() < faults.malformed_rate
            ]
            if rng.random() < faults.aborted_rate:
                main.send(records + bad, commit=False)
                manifest.aborted.update(ids)
            else:
                main.send(records, commit=True)
                if bad:
                    main.send(bad, commit=True, on_delivered=malformed_at)
                manifest.committed_valid.update(ids)
                sent.extend(ids)
                manifest.duplicates_sent += len(again)
            manifest.records_sent += len(records) + len(bad)
            if rate:
                time.sleep((len(records) + len(bad)) / rate)
    for producer, ids in late:
        producer.commit()
        manifest.committed_valid.update(ids)
    return manifest


def parser() -> argparse.ArgumentParser:
    """`slicewise-produce`'s command line."""
    parser = argparse.ArgumentParser(
        prog="slicewise-produce",
        description="Send a realistic stream with faults to SLICEWISE_TOPIC and write its oracle.",
    )
    parser.add_argument("--start", type=instant, required=True, help="first interval's start")
    parser.add_argument("--intervals", type=int, default=3, help="hours of events (default 3)")
    parser.add_argument("--events", type=int, default=600, help="new events in all (default 600)")
    parser.add_argument("--partitions", type=int, default=3, help="if the topic is created")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="records/s; 0 = as fast as possible"
    )
    parser.add_argument("--duplicate-rate", type=float, default=0.05)
    parser.add_argument("--aborted-rate", type=float, default=0.1)
    parser.add_argument("--malformed-rate", type=float, default=0.02)
    parser.add_argument("--open-transactions", type=int, default=1)
    parser.add_argument("--skew-minutes", type=int, default=0)
    parser.add_argument("--drift-rate", type=float, default=0.0, help="events with a new field")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--shape", choices=[*sorted(SHAPES), "avro-events"], default="events", help="event shape"
    )
    parser.add_argument("--manifest", type=Path, required=True, help="where to write the oracle")
    return parser


def main(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    args = parser().parse_args(argv)
    settings = settings or load_settings()
    faults = Faults(
        args.duplicate_rate, args.aborted_rate, args.malformed_rate,
        args.open_transactions, args.skew_minutes, args.drift_rate,
    )  # fmt: skip
    manifest = produce(
        settings, args.start, args.intervals, args.events, faults,
        args.partitions, args.rate, args.seed, shape=args.shape,
    )  # fmt: skip
    args.manifest.write_text(manifest.to_json())
    print(
        f"{manifest.records_sent} records to {settings.topic}: {len(manifest.committed_valid)} "
        f"committed valid events, {manifest.duplicates_sent} duplicates, "
        f"{len(manifest.aborted)} aborted, {len(manifest.malformed)} malformed; "
        f"oracle in {args.manifest}"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
