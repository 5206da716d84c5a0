"""Tracking partitions whose LSO an open transaction holds back (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from slicewise.holds import Hold, overdue, track

T = datetime(2026, 11, 25, 10, tzinfo=timezone.utc)


def test_a_partition_is_held_where_its_lso_is_behind_the_high_watermark():
    holds = track({}, lso={0: 10, 1: 7}, high={0: 10, 1: 12}, now=T)
    assert holds == {1: Hold(1, 7, 5, T)}


def test_a_hold_keeps_its_start_while_the_lso_stays_and_restarts_when_it_moves():
    first = track({}, {1: 7}, {1: 12}, T)
    same = track(first, {1: 7}, {1: 20}, T + timedelta(hours=1))
    assert same[1].since == T and same[1].waiting == 13
    moved = track(same, {1: 15}, {1: 20}, T + timedelta(hours=2))
    assert moved[1].since == T + timedelta(hours=2)
    assert track(moved, {1: 20}, {1: 20}, T + timedelta(hours=3)) == {}


def test_only_holds_past_the_limit_are_overdue():
    holds = {1: Hold(1, 7, 5, T), 2: Hold(2, 3, 1, T + timedelta(minutes=10))}
    now = T + timedelta(minutes=16)
    assert overdue(holds, now, timedelta(minutes=15)) == [holds[1]]
    assert overdue(holds, now, None) == []
    assert (
        "held at 7 by an open transaction since 2026-11-25T10:00:00+00:00 (16 min), 5 records"
        in (holds[1].describe(now))
    )
