"""Pure slice-model functions: no Kafka, no Spark."""

from datetime import datetime, timedelta, timezone

import pytest

from slicewise.slices import (
    Boundary,
    ContiguityError,
    DataLossError,
    check_contiguous,
    find_data_loss,
    find_loss_before_planning,
    resolve_offset,
    rewritten_below,
    slice_between,
)

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def b(hours: int, **offsets: int) -> Boundary:
    return Boundary(
        "events", T0 + timedelta(hours=hours), {int(k[1:]): v for k, v in offsets.items()}
    )


@pytest.mark.parametrize(
    ("at_time", "lso", "floor", "ceiling", "expected"),
    [
        (10, 50, 0, None, 10),  # offset for the time
        (None, 50, 0, None, 50),  # no record at/after t yet: up to the LSO
        (70, 50, 0, None, 50),  # never past the LSO (open transaction)
        (3, 50, 8, None, 8),  # never below an earlier stored boundary
        (40, 50, 0, 30, 30),  # never above a later stored boundary
    ],
)
def test_resolve_offset(at_time, lso, floor, ceiling, expected):
    assert resolve_offset(at_time, lso, floor, ceiling) == expected


def test_slice_between_covers_new_partition_from_zero():
    sl = slice_between(b(0, p0=5), b(1, p0=9, p1=4))
    assert sl.ranges == {0: (5, 9), 1: (0, 4)}
    assert sl.slice_id == "20261101T000000Z-20261101T010000Z"


def test_consecutive_slices_share_boundaries_and_never_overlap():
    bounds = [b(0, p0=0, p1=0), b(1, p0=4, p1=0), b(2, p0=4, p1=7), b(3, p0=12, p1=9)]
    slices = [slice_between(lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    for p in (0, 1):
        covered = [o for sl in slices for o in range(*sl.ranges[p])]
        assert covered == list(range(bounds[0].offset(p), bounds[-1].offset(p)))


def test_decreasing_boundary_is_refused():
    with pytest.raises(ContiguityError, match="partition 0"):
        check_contiguous([b(0, p0=9), b(1, p0=5)])


def test_data_loss_report_names_partitions_and_ranges():
    sl = slice_between(b(0, p0=0, p1=10), b(1, p0=20, p1=30))
    losses = find_data_loss(sl, {0: 15, 1: 10})
    assert [(d.partition, d.missing_from, d.missing_until, d.count) for d in losses] == [
        (0, 0, 15, 15)
    ]
    message = str(DataLossError.in_slice(sl, losses))
    assert "partition 0: offsets [0, 15) are gone (15 offsets)" in message
    assert "accept_data_loss" in message


def test_naive_datetime_is_rejected():
    with pytest.raises(ValueError, match="time zone"):
        slice_between(
            Boundary("e", datetime(2026, 1, 1), {}), Boundary("e", datetime(2026, 1, 2), {})
        )


def test_pendulum_times_from_airflow_are_normalised():
    import pendulum

    from slicewise.slices import utc

    got = utc(pendulum.datetime(2026, 11, 1, 3, tz="Europe/Paris")) + timedelta(seconds=30)
    assert (
        got == datetime(2026, 11, 1, 2, 0, 30, tzinfo=timezone.utc) and got.tzinfo is timezone.utc
    )


def test_loss_before_planning_needs_deleted_offsets_and_a_retained_record_after_the_start():
    floor = {0: 10, 1: 10, 2: 10, 3: 0}
    earliest = {0: 15, 1: 15, 2: 10, 3: 7}
    # p0: its earliest record is after the start: offsets 10..15 may have been the interval's.
    # p1: records before the start are retained, so what was deleted was older than it.
    # p2: nothing deleted since the previous boundary. p3: no previous boundary, nothing left.
    at_start = {0: 15, 1: 18, 2: 10, 3: None}
    losses = find_loss_before_planning(floor, earliest, at_start)
    assert [(d.partition, d.missing_from, d.missing_until) for d in losses] == [(0, 10, 15)]
    message = str(DataLossError.before_planning("events", T0, T0 + timedelta(hours=1), losses))
    assert "partition 0: offsets [10, 15) are gone (5 offsets)" in message
    assert "Nothing was frozen" in message and "slicewise plan" in message


def test_a_log_rewritten_below_a_boundary_is_found_by_leader_epoch():
    """KIP-320: the last record below each offset, and its leader epoch, as stored; read
    again after an unclean election whose new leader's log was refilled past it."""
    stored = Boundary("events", T0, {0: 10, 1: 20, 2: 30}, below={0: (8, 0), 1: (19, 0), 2: (5, 1)})
    same = {0: (8, 0), 1: (19, 0), 2: (5, 1)}
    assert rewritten_below(stored, same, {}) == []
    refilled = {0: (8, 0), 1: (19, 2), 2: (5, 1)}  # offset 19 of partition 1 is another record
    [change] = rewritten_below(stored, refilled, {})
    assert "partition 1" in change and "leader epoch 0" in change and "epoch 2" in change
    moved = {0: (9, 2), 1: (19, 0), 2: (5, 1)}  # a record where only markers were
    assert "partition 0" in rewritten_below(stored, moved, {})[0]
    # Nothing read (no record in the window now), or deleted by retention: no evidence.
    assert rewritten_below(stored, {0: None, 1: None}, {}) == []
    assert rewritten_below(stored, {**same, 2: (7, 3)}, {2: 6}) == []


def test_a_boundary_keeps_the_records_below_it_in_the_ledger(tmp_path):
    from slicewise.ledger import Ledger

    ledger = Ledger(str(tmp_path), "events")
    ledger.put_boundary(Boundary("events", T0, {0: 10, 1: 0}, T0, below={0: (9, 3)}))
    assert ledger.boundary(T0).below == {0: (9, 3)}
    before_kip320 = Boundary("events", T0 + timedelta(hours=1), {0: 12}, T0)
    assert ledger.put_boundary(before_kip320).below == {}
