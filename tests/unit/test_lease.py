"""The planning lease on a real folder: one holder at a time, and a holder whose lease
was taken over stores no boundary (`slicewise.lease`)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

import slicewise.lease as lease_module
from slicewise.lease import LeaseLost, generations
from slicewise.ledger import Ledger
from slicewise.slices import Boundary

T0 = datetime(2026, 11, 20, tzinfo=timezone.utc)
SHORT = timedelta(seconds=0.3)  # for a holder nobody waits on: the next planner waits it out
LEASE = timedelta(minutes=1)


class Clock:
    """The lease's clock, moved by the test: a holder's lease lasts until the test
    says it expired, however slowly a loaded machine runs the test."""

    def __init__(self) -> None:
        self.ahead = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(timezone.utc) + self.ahead

    def expire(self, lease: timedelta) -> None:
        self.ahead += lease + timedelta(seconds=1)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    moved = Clock()
    monkeypatch.setattr(lease_module, "_now", moved)
    return moved


def boundary(h: int, offset: int) -> Boundary:
    return Boundary("t", T0 + timedelta(hours=h), {0: offset}, T0)


def test_planners_hold_the_lease_one_at_a_time(tmp_path) -> None:
    ledger = Ledger(str(tmp_path), "t")
    inside, most = [0], [0]
    guard = threading.Lock()

    def plan(i: int) -> None:
        for _ in range(5):
            with ledger.planning():
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.01)
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=plan, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert most[0] == 1
    assert generations(ledger.store)[-1] == 20  # each holding a generation of its own


def test_a_released_lease_is_taken_at_once(tmp_path, monkeypatch) -> None:
    ledger = Ledger(str(tmp_path), "t")
    with ledger.planning(lease=timedelta(hours=1)):
        pass

    def waits(_: float) -> None:
        raise AssertionError("the next planner waited for a released lease")

    monkeypatch.setattr(lease_module.time, "sleep", waits)
    with ledger.planning():
        pass


def test_a_holder_whose_lease_was_taken_over_stores_nothing(tmp_path, clock) -> None:
    """A holds the lease, stores hour 0, stalls past its lease; B takes over and stores
    hour 1. A, awake, must not store hour 2 below hour 1: its intent was voided."""
    ledger = Ledger(str(tmp_path), "t")
    with ledger.planning(lease=LEASE) as a:
        ledger.put_boundary(boundary(0, 5), a)
        clock.expire(LEASE)
        with ledger.planning() as b:
            ledger.put_boundary(boundary(1, 10), b)
        with pytest.raises(LeaseLost, match="plan again"):
            ledger.put_boundary(boundary(2, 7), a)
    assert [x.offsets[0] for x in ledger.boundaries()] == [5, 10]


def test_a_holder_is_fenced_even_before_anyone_takes_over(tmp_path, clock) -> None:
    """Past its lease by its own clock, a holder stores nothing, taken over or not."""
    ledger = Ledger(str(tmp_path), "t")
    with ledger.planning(lease=LEASE) as a:
        clock.expire(LEASE)
        with pytest.raises(LeaseLost):
            ledger.put_boundary(boundary(0, 5), a)
    assert ledger.boundaries() == []


def test_what_an_expired_holder_intended_is_stored_before_the_next_plans(
    tmp_path, monkeypatch, clock
) -> None:
    """A claims hour 0 (its intent written) and dies before storing it; the planner
    taking over stores it first, so nothing A may still store contradicts what the
    next holder resolves."""
    ledger = Ledger(str(tmp_path), "t")

    def dies(key: str, data: bytes) -> bool:
        if key.startswith("boundaries/"):
            raise SystemExit("killed")
        return real(key, data)

    real = ledger.store.create
    with pytest.raises(SystemExit):
        with ledger.planning(lease=LEASE) as a:
            monkeypatch.setattr(ledger.store, "create", dies)
            ledger.put_boundary(boundary(0, 5), a)
    monkeypatch.setattr(ledger.store, "create", real)
    assert ledger.boundary(T0) is None
    released = lease_module._read(ledger.store, lease_module._lease_key(1))
    assert released["released"]  # the context exited: a clean release, nothing to void
    # A holder that died without releasing: its intent is completed on takeover.
    with pytest.raises(SystemExit), monkeypatch.context() as dying:
        with ledger.planning(lease=LEASE) as a:
            dying.setattr(ledger.store, "create", dies)
            dying.setattr(ledger.store, "replace", lambda *_: None)  # no release
            ledger.put_boundary(boundary(0, 6), a)
    clock.expire(LEASE)
    with ledger.planning():
        assert ledger.boundary(T0).offsets == {0: 6}


def test_old_released_leases_are_forgotten_and_taken_over_ones_kept_an_hour(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(lease_module, "KEEP", 2)
    ledger = Ledger(str(tmp_path), "t")
    for h in range(4):
        with ledger.planning() as held:
            ledger.put_boundary(boundary(h, h), held)
    assert generations(ledger.store) == [2, 3, 4]  # the newest two below the holder kept
    with ledger.planning(lease=SHORT), ledger.planning():  # 5 expires, 6 takes over
        pass
    assert generations(ledger.store) == [4, 5, 6]
    assert "planning/000000000005.000000.intent" in ledger.store.keys("planning")  # the void
    monkeypatch.setattr(lease_module, "FORGET_AFTER", timedelta(seconds=-60))
    for _ in range(3):
        with ledger.planning():
            pass
    assert ledger.store.keys("planning") == [
        "planning/000000000007.json",
        "planning/000000000008.json",
        "planning/000000000009.json",
    ]
