"""The ledger finds neighbours and the latest slices by name, on a real folder."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from slicewise.ledger import BY_DAY, Ledger, newest_first, slice_to_json
from slicewise.slices import Boundary, slice_between, stamp

T0 = datetime(2026, 11, 20, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def boundary(h: int, offset: int = 0) -> Boundary:
    return Boundary("t", T0 + h * HOUR, {0: offset + h}, T0)


def hourly(ledger: Ledger, hours: int) -> list:
    """Boundaries at T0 and each hour after it, and the slices between them."""
    stored = [ledger.put_boundary(boundary(h)) for h in range(hours + 1)]
    slices = [slice_between(a, b) for a, b in zip(stored, stored[1:], strict=False)]
    for sl in slices:
        ledger.save_slice(sl)
    return slices


def test_newest_first_reverses_the_order_of_stamps():
    stamps = ["20261120T000000Z", "20261120T010000Z", "20271231T235959Z"]
    assert sorted(stamps, key=newest_first) == stamps[::-1]


def test_neighbours_skip_gaps_and_markers_whose_boundary_was_never_written(tmp_path):
    ledger = Ledger(str(tmp_path), "t")
    for h in (0, 1, 5, 9):
        ledger.put_boundary(boundary(h))
    # A resolver that died between its marker and its boundary leaves the marker only.
    ledger.store.create(ledger._marker("boundaries", "20261120T070000Z"), b"")
    assert ledger.neighbours(T0 + 8 * HOUR) == (boundary(5), boundary(9))
    assert ledger.neighbours(T0 + 5 * HOUR) == (boundary(1), boundary(9))
    assert ledger.neighbours(T0) == (None, boundary(1))
    assert ledger.newest_boundary() == boundary(9)


def test_neighbours_skip_objects_an_s3_server_lists_while_they_are_being_written(tmp_path):
    # s3proxy's filesystem backend lists `<key>-<uuid>` until the put's rename: seen on CI
    # when four planners raced, and `after` once parsed such a name as a stamp.
    ledger = Ledger(str(tmp_path), "t")
    for h in (0, 5, 9):
        ledger.put_boundary(boundary(h))
    in_flight = "-2ea3e2ef-f224-4de2-a5e0-c1b73f7"
    ledger.store.create(f"boundaries/20261120/20261120T060000Z.json{in_flight}", b"")
    ledger.store.create(ledger._marker("boundaries", "20261120T040000Z") + in_flight, b"")
    ledger.store.create(
        ledger._marker("slices", "20261120T040000Z-20261120T050000Z") + in_flight, b""
    )
    assert ledger.neighbours(T0 + 5 * HOUR) == (boundary(0), boundary(9))
    assert ledger.neighbours(T0 + 3 * HOUR) == (boundary(0), boundary(5))
    assert ledger.boundaries() == [boundary(0), boundary(5), boundary(9)]
    assert ledger.latest_slices(5) == []


def test_latest_slices_newest_last_and_since(tmp_path):
    ledger = Ledger(str(tmp_path), "t")
    slices = hourly(ledger, 29)
    assert ledger.latest_slices(3) == slices[-3:]
    assert ledger.latest_slices(100) == slices
    assert ledger.latest_slices(100, since=T0 + 25 * HOUR) == slices[25:]


@pytest.mark.parametrize("with_markers", [False, True])
def test_a_ledger_an_earlier_version_wrote_flat_gets_its_day_folders_once(tmp_path, with_markers):
    flat = Ledger(str(tmp_path), "t").store
    stored = [boundary(h) for h in range(22, 27)]  # across midnight
    slices = [slice_between(a, b) for a, b in zip(stored, stored[1:], strict=False)]
    for b in stored:  # as earlier versions wrote them: one folder, markers or none
        name = stamp(b.at)
        if with_markers:
            flat.create(f"newest-first/boundaries/{newest_first(name)}", b"")
        flat.create(f"boundaries/{name}.json", json.dumps(_json(b)).encode())
    for sl in slices:
        if with_markers:
            flat.create(f"newest-first/slices/{newest_first(sl.slice_id)}", b"")
        flat.create(f"slices/{sl.slice_id}/slice.json", json.dumps(slice_to_json(sl)).encode())

    ledger = Ledger(str(tmp_path), "t")
    assert ledger.neighbours(T0 + 24 * HOUR) == (stored[1], stored[3])
    assert ledger.boundaries() == stored
    assert ledger.latest_slices(3) == slices[-3:]
    assert ledger.newest_boundary() == stored[-1]
    assert ledger.store.read(BY_DAY) is not None
    assert ledger.boundary(stored[0].at) == stored[0]


def test_finding_a_neighbour_lists_one_day_not_the_history(tmp_path):
    """Each listing names a day's folder (or lists the days): a server that walks the
    folder it lists (s3proxy, MinIO on a filesystem) never walks the whole history."""
    ledger = Ledger(str(tmp_path), "t")
    slices = hourly(ledger, 24 * 5)
    listed: list[str] = []
    real_keys = ledger.store.keys

    def keys(prefix: str, after: str | None = None, limit: int | None = None) -> list[str]:
        listed.append(prefix)
        return real_keys(prefix, after, limit)

    ledger.store.keys = keys  # type: ignore[method-assign]
    assert ledger.neighbours(T0 + 50 * HOUR) == (boundary(49), boundary(51))
    assert ledger.neighbours(T0 + 24 * HOUR) == (boundary(23), boundary(25))
    assert ledger.latest_slices(30) == slices[-30:]
    assert ledger.after(T0 + 120 * HOUR) is None
    assert listed and all(re.fullmatch(r"\d{8}", p.rsplit("/", 1)[1]) for p in listed), listed


def _json(b: Boundary) -> dict:
    return {
        "topic": b.topic,
        "at": b.at.isoformat(),
        "offsets": {str(p): o for p, o in b.offsets.items()},
        "resolved_at": b.resolved_at.isoformat(),
    }


def test_status_shows_the_latest_a_time_range_or_one_slice(tmp_path):
    from slicewise.cli import shown_slices

    ledger = Ledger(str(tmp_path), "t")
    slices = hourly(ledger, 39)
    assert shown_slices(ledger, 24, None, None) == slices[-24:]
    assert shown_slices(ledger, 24, T0 + 30 * HOUR, None) == slices[30:]
    assert shown_slices(ledger, 24, None, slices[3].slice_id) == [slices[3]]
