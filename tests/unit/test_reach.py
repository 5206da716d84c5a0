"""A slice's reach in silver (`windows.own_reach`, `Reach.ranges`): the dates its own
events carry, widened by the horizon, never the days between a late event and today."""

from __future__ import annotations

from datetime import date
from types import SimpleNamespace

from slicewise.windows import Reach, own_reach

TODAY = date(2026, 12, 7)


def span(*dates: date) -> dict:
    return {"first": min(dates), "dates": sorted(dates)}


def horizon(days: int) -> SimpleNamespace:
    return SimpleNamespace(dedup_horizon_days=days)


def test_a_slice_of_one_date_reaches_that_date_only():
    assert own_reach(span(TODAY), horizon(0)) == Reach((TODAY, TODAY))
    assert own_reach({"first": None, "dates": []}, horizon(0)) is None
    assert own_reach(None, horizon(0)) is None


def test_a_late_event_adds_its_own_date_not_the_year_before_today():
    late = date(2025, 12, 7)
    reach = own_reach(span(TODAY, date(2026, 12, 6), late), horizon(0))
    assert reach == Reach((date(2026, 12, 6), TODAY), (late,))
    assert reach.ranges() == [(date(2026, 12, 6), TODAY), (late, late)]
    assert reach.sql("d") == (
        "(d BETWEEN DATE'2026-12-06' AND DATE'2026-12-07' "
        "OR d BETWEEN DATE'2025-12-07' AND DATE'2025-12-07')"
    )


def test_with_a_horizon_each_date_is_widened_and_the_widest_range_is_the_window():
    # 12-04 widened ends on 12-05, the day before 12-07's widened range starts: one range.
    reach = own_reach(span(TODAY, date(2026, 12, 4), date(2026, 6, 1)), horizon(1))
    assert reach.window == (date(2026, 12, 3), date(2026, 12, 8))
    assert reach.far == (date(2026, 5, 31), date(2026, 6, 1), date(2026, 6, 2))
    assert reach.ranges() == [reach.window, (date(2026, 5, 31), date(2026, 6, 2))]


def test_far_dates_inside_the_window_or_repeated_add_no_range():
    reach = Reach(
        (date(2026, 12, 1), TODAY), (date(2026, 12, 3), date(2026, 1, 2), date(2026, 1, 2))
    )
    assert reach.ranges() == [(date(2026, 12, 1), TODAY), (date(2026, 1, 2), date(2026, 1, 2))]
