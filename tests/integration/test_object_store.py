"""The offset ledger on an object store: s3proxy (a real S3-compatible server that checks
conditional puts atomically) in the bucket of the tables, no local path involved."""

from __future__ import annotations

import json
import os
import random
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timedelta, timezone
from multiprocessing import get_context

import pytest

from slicewise.config import load_settings
from slicewise.ledger import Ledger, slice_to_json
from slicewise.planner import plan_slice
from slicewise.slices import Boundary, check_contiguous
from slicewise.store import ObjectStore
from slicewise_dev.producer import Record, event_value

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(days=1)).replace(
    hour=0, minute=0, second=0, microsecond=0
)
HOUR = timedelta(hours=1)
LATER = datetime.now(timezone.utc) + timedelta(days=365)


def plan_in_order(env: dict[str, str], t0: datetime, hours: list[int]) -> dict[int, dict]:
    """One planner process: plans the given hours in its own order. It takes the parent's
    T0: a spawned process re-imports this module, and past midnight its T0 would differ."""
    os.environ.update(env)
    settings = load_settings()
    return {
        h: slice_to_json(plan_slice(settings, t0 + h * HOUR, t0 + (h + 1) * HOUR, now=LATER))
        for h in hours
    }


def test_the_first_boundary_written_wins_on_the_object_store(pipeline_factory, s3_lakehouse):
    settings, _ = pipeline_factory(SLICEWISE_LAKEHOUSE=s3_lakehouse)
    ledger = Ledger.of(settings)
    assert isinstance(ledger.store, ObjectStore)
    first = ledger.put_boundary(Boundary(settings.topic, T0, {0: 5}, datetime.now(timezone.utc)))
    second = ledger.put_boundary(Boundary(settings.topic, T0, {0: 9}, datetime.now(timezone.utc)))
    assert second == first and ledger.boundary(T0).offsets == {0: 5}
    assert ledger.boundaries() == [first]


def test_concurrent_planners_on_the_object_store_freeze_one_contiguous_slice_per_interval(
    pipeline_factory, s3_lakehouse
):
    settings, producer = pipeline_factory(SLICEWISE_LAKEHOUSE=s3_lakehouse)
    producer.send(
        [
            Record(
                event_value(f"e{i}", T0 + i * timedelta(minutes=7)),
                i % 3,
                T0 + i * timedelta(minutes=7),
            )
            for i in range(40)
        ]
    )
    env = {
        **{k: v for k, v in os.environ.items() if k.startswith(("AWS_", "SLICEWISE_"))},
        "SLICEWISE_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "SLICEWISE_TOPIC": settings.topic,
        "SLICEWISE_STATE_DIR": str(settings.state_dir),
        "SLICEWISE_LAKEHOUSE": s3_lakehouse,
    }
    hours = list(range(5))
    orders = [random.Random(seed).sample(hours, len(hours)) for seed in range(4)]
    with ProcessPoolExecutor(len(orders), mp_context=get_context("spawn")) as pool:
        seen = list(pool.map(plan_in_order, [env] * len(orders), [T0] * len(orders), orders))

    # Every planner got the same slice for every hour: one answer per boundary.
    for h in hours:
        assert len({json.dumps(planner[h], sort_keys=True) for planner in seen}) == 1, h
    ledger = Ledger.of(settings)
    boundaries = ledger.boundaries()
    assert [b.at for b in boundaries] == [T0 + h * HOUR for h in range(6)]
    check_contiguous(boundaries)
    # The slices own exactly the offsets the producer wrote (its commit markers included).
    owned = {
        p: sum(b - a for a, b in [sl.ranges.get(p, (0, 0)) for sl in ledger.slices()])
        for p in range(3)
    }
    last = boundaries[-1].offsets
    assert owned == {p: last.get(p, 0) - boundaries[0].offset(p) for p in range(3)}
    assert sum(owned.values()) >= 40
    assert not (settings.state_dir / "lakehouse").exists()  # nothing on local disk


def test_the_ledgers_credentials_can_come_from_an_airflow_connection(
    pipeline_factory, s3_lakehouse, local_s3, monkeypatch
):
    from slicewise.operators import task_settings

    settings, _ = pipeline_factory(SLICEWISE_LAKEHOUSE=s3_lakehouse)
    for name in local_s3.env:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLICEWISE_LAKEHOUSE", s3_lakehouse)
    monkeypatch.setenv("SLICEWISE_TOPIC", settings.topic)
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": local_s3.access_key,
                "password": local_s3.secret_key,
                "extra": {"region_name": local_s3.region, "endpoint_url": local_s3.endpoint},
            }
        ),
    )
    monkeypatch.setenv("SLICEWISE_AWS_CONN_ID", "lake_s3")
    assert "AWS_ENDPOINT_URL" not in os.environ  # only the connection knows the store
    task = task_settings()
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == local_s3.secret_key
    ledger = Ledger(task.ledger_dir, task.topic)
    stored = ledger.put_boundary(Boundary(task.topic, T0, {0: 1}, datetime.now(timezone.utc)))
    assert ledger.boundaries() == [stored]
