"""A plan and `status` cost the same ledger reads after 2,000 slices as after 10.

Every call the ledger makes to its store (reads, listings, creates, replaces) is
counted on the real store, a folder and s3proxy, for the same two operations at
two history lengths: planning the next hour on a real broker, and `status`.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import slicewise.ledger
from slicewise.cli import shown_slices, status_freshness, status_rows
from slicewise.config import Settings
from slicewise.ledger import Ledger
from slicewise.planner import plan_slice
from slicewise.slices import Boundary, slice_between
from slicewise_dev.counting_store import CountingStore
from slicewise_dev.producer import Record, event_value

pytestmark = pytest.mark.integration

HOUR = timedelta(hours=1)
T0 = (datetime.now(timezone.utc) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
LATER = datetime.now(timezone.utc) + timedelta(days=1)


def write_history(settings: Settings, slices: int) -> None:
    """`slices` planned hours ending at T0, written through the ledger (many at once)."""
    ledger = Ledger.of(settings)
    times = [T0 - (slices - i) * HOUR for i in range(slices + 1)]
    with ThreadPoolExecutor(16) as pool:
        stored = list(
            pool.map(
                lambda i: ledger.put_boundary(
                    Boundary(settings.topic, times[i], {p: 0 for p in range(3)}, T0)
                ),
                range(len(times)),
            )
        )
        list(
            pool.map(
                lambda i: ledger.save_slice(slice_between(stored[i], stored[i + 1])), range(slices)
            )
        )


def counted_calls(monkeypatch: pytest.MonkeyPatch, action: Any) -> dict[str, int]:
    stores: list[CountingStore] = []
    real = slicewise.ledger.open_store

    def counting(location: str) -> CountingStore:
        stores.append(CountingStore(real(location)))
        return stores[-1]

    with monkeypatch.context() as patched:
        patched.setattr(slicewise.ledger, "open_store", counting)
        action()
    return dict(sum((s.calls for s in stores), Counter()))


def plan_and_status_calls(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> dict[str, dict[str, int]]:
    def plan() -> None:
        sl = plan_slice(settings, T0, T0 + HOUR, now=LATER)
        # The nine records and each partition's transaction commit marker.
        assert sum(b - a for a, b in sl.ranges.values()) == 9 + 3

    def status() -> None:
        ledger = Ledger.of(settings)
        rows = status_rows(ledger, shown_slices(ledger, 10, None, None))
        assert len(rows) == 10
        assert rows[-1]["interval"] == [T0.isoformat(), (T0 + HOUR).isoformat()]
        assert status_freshness(settings, ledger, rows).newest_boundary == T0 + HOUR

    return {"plan": counted_calls(monkeypatch, plan), "status": counted_calls(monkeypatch, status)}


@pytest.mark.parametrize("where", ["disk", "object store"])
def test_plan_and_status_read_as_much_at_slice_2000_as_at_slice_10(
    where, pipeline_factory, request, monkeypatch
):
    lake = (
        {} if where == "disk" else {"SLICEWISE_LAKEHOUSE": request.getfixturevalue("s3_lakehouse")}
    )
    calls = {}
    for history in (10, 2000):
        settings, producer = pipeline_factory(**lake)
        producer.send(
            [
                Record(event_value(f"e{i}", T0), i % 3, T0 + i * timedelta(minutes=5))
                for i in range(9)
            ]
        )
        write_history(settings, history)
        calls[history] = plan_and_status_calls(settings, monkeypatch)
    assert calls[2000] == calls[10], calls
    assert sum(calls[10]["plan"].values()) < 40, calls[10]
