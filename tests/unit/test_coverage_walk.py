"""The walk coverage makes over the slices (`slicewise.coverage.run_from`), without I/O."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from slicewise.coverage import Unowned, run_from
from slicewise.slices import Slice

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
H = timedelta(hours=1)


def sl(a: float, b: float) -> Slice:
    return Slice("t", T0 + a * H, T0 + b * H, {0: (int(a * 10), int(b * 10))})


def test_contiguous_slices_cover_up_to_until_and_the_walk_stops_there():
    slices = [sl(0, 1), sl(1, 2), sl(2, 3)]
    assert run_from(T0, slices, until=T0 + 2 * H) == (T0 + 2 * H, slices[1], None)
    assert run_from(T0, slices) == (T0 + 3 * H, slices[2], None)


def test_a_skipped_interval_is_the_first_unowned_range():
    slices = [sl(0, 1), sl(2, 3)]
    assert run_from(T0, slices) == (T0 + H, slices[0], Unowned(T0 + H, T0 + 2 * H))
    # Nothing planned up to `until`: the range up to it is unowned.
    assert run_from(T0 + 3 * H, [], until=T0 + 5 * H)[2] == Unowned(T0 + 3 * H, T0 + 5 * H)


def test_a_slice_that_does_not_count_ends_the_run_below_it():
    slices = [sl(0, 1), sl(1, 2), sl(2, 3)]
    published = {slices[0].slice_id, slices[2].slice_id}
    end, last, gap = run_from(T0, slices, counts=lambda s: s.slice_id in published)
    assert (end, last, gap) == (T0 + H, slices[0], None)


def test_a_slice_before_the_origin_is_passed_over_and_an_overlapping_one_extends_the_run():
    slices = [sl(-1, 0), sl(0, 0.25), sl(0, 1), sl(1, 2)]  # ids sort the shorter first
    assert run_from(T0, slices) == (T0 + 2 * H, slices[3], None)
