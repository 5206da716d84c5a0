"""A slice's recorded gate outcome is one truth: reruns are listed beside the first pass."""

from __future__ import annotations

from slicewise.cli import _rechecked
from slicewise.gate import settled

COUNTS = {"read": 22, "quarantined": 1, "duplicates_in_slice": 1, "inserted": 20}
COUNTS |= {"duplicates_in_silver": 0, "missing": 0}
PASSED = {"success": True, "counts": COUNTS, "recorded_at": "2026-11-25T10:00:00+00:00"}


def test_a_first_outcome_and_a_failure_are_recorded_as_they_are():
    failed = {"success": False, "counts": {**COUNTS, "missing": 1}}
    assert settled(None, PASSED) == PASSED
    assert settled(PASSED, failed) == failed  # nothing may be published past it
    assert settled(failed, PASSED) == PASSED


def test_a_passing_rerun_keeps_the_first_outcome_and_lists_itself():
    again = settled(PASSED, {"success": True, "counts": dict(COUNTS)})
    assert {k: again[k] for k in PASSED} == PASSED
    assert [r["counts"] for r in again["rechecks"]] == [None]
    moved = {**COUNTS, "inserted": 14, "duplicates_in_silver": 6}
    twice = settled(again, {"success": True, "counts": moved})
    assert twice["counts"] == COUNTS
    assert [r["counts"] for r in twice["rechecks"]] == [None, moved]


def test_status_says_whether_a_recheck_saw_other_counts():
    assert _rechecked([]) == ""
    assert _rechecked([{"counts": None}, {"counts": None}]) == "  rechecked 2x, same counts"
    moved = {**COUNTS, "inserted": 14, "duplicates_in_silver": 6}
    assert "latest: ins 14 dupX 6 quar 1" in _rechecked([{"counts": None}, {"counts": moved}])
