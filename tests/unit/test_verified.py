"""What publication may read: silver's tagged commits against the gates' records
(`publish.proved_prefix`, `commits`), without Spark."""

from __future__ import annotations

import time

from slicewise.commits import Commit, slice_tag, tagged_slices
from slicewise.publish import Proved, proved_prefix

NOW = int(time.time())


def log(*commits: tuple[int, tuple[str, ...]]) -> list[Commit]:
    return [Commit(v, slices, NOW) for v, slices in commits]


def test_a_commits_tag_names_the_slices_it_wrote_for():
    tag = slice_tag(["b", "a", "a"], attempt="f00")
    assert tag == "slicewise slices=a,b attempt=f00"
    assert tagged_slices(tag) == ("a", "b")
    assert tagged_slices(None) == tagged_slices("slicewise-merge-0123") == ()
    assert slice_tag(["x"]) != slice_tag(["x"])  # each attempt its own


def test_a_clean_up_tagged_with_no_slice_is_not_a_write_by_hand():
    # silver.settle_far_copies, every owner's gate passed: a slice step's commit, no gate
    assert tagged_slices(slice_tag([])) == ()
    assert not Commit(3, (), NOW, "MERGE", tagged=True).by_hand
    assert Commit(3, (), NOW, "MERGE").by_hand
    assert not Commit(3, (), NOW, "OPTIMIZE").by_hand


def gates(**outcomes: tuple[bool, int]) -> dict:
    return {s: {"success": ok, "silver_version": v} for s, (ok, v) in outcomes.items()}


def test_publication_reads_the_newest_version_every_commit_below_was_seen_at():
    commits = log((1, ("x",)), (2, ("y",)), (3, ()), (4, ("z",)))
    seen = gates(x=(True, 2), y=(True, 2), z=(True, 4))
    assert proved_prefix(0, commits, seen.get) == Proved(4, [], [])
    # y's gate ran at 3: version 2 holds x's and y's rows, but y's gate saw them only at 3
    seen = gates(x=(True, 1), y=(True, 3))
    assert proved_prefix(0, commits, seen.get) == Proved(3, [], ["z"])


def test_a_retried_commit_after_the_gate_is_not_proved_by_it():
    """X's gate saw version 1; X's retry (or replay) committed again at 3."""
    commits = log((1, ("x",)), (2, ("y",)), (3, ("x",)))
    seen = gates(x=(True, 1), y=(True, 2))
    assert proved_prefix(0, commits, seen.get) == Proved(2, [], ["x"])


def test_a_failed_gate_stops_publication_below_it_and_is_named():
    commits = log((5, ("x",)), (6, ("y",)))
    seen = gates(x=(False, 5), y=(True, 6))
    assert proved_prefix(4, commits, seen.get) == Proved(4, ["x"], [])
    # a gate never run, or run before the version-pinning gates (no version recorded)
    assert proved_prefix(4, commits, {"x": {"success": True}}.get) == Proved(4, [], ["x"])


def test_a_replays_commit_waits_for_every_slice_whose_copies_it_brought_in():
    commits = log((7, ("r", "z")))
    assert proved_prefix(6, commits, gates(r=(True, 7)).get) == Proved(6, [], ["z"])
    assert proved_prefix(6, commits, gates(r=(True, 7), z=(True, 7)).get) == Proved(7, [], [])


def test_a_slice_past_a_range_no_slice_owns_caps_the_version_as_if_pending():
    # y lies past an unowned range: publication reads below its commit, whatever its gate.
    commits = log((1, ("x",)), (2, ("y",)), (3, ("z",)))
    seen = gates(x=(True, 1), y=(True, 2), z=(True, 3))
    assert proved_prefix(0, commits, seen.get) == Proved(3, [], [])
    assert proved_prefix(0, commits, seen.get, lambda s: s == "y") == Proved(1, [], ["y"], True)


def test_a_write_by_hand_is_proved_only_by_a_gate_run_at_or_above_it():
    # Version 2 changed rows outside any slice step (a repair, a bad manual write).
    commits = log((1, ("x",)), (2, ()), (3, ("y",)))
    seen = gates(x=(True, 1), y=(True, 3))  # y's gate ran after it: proved through 3
    assert proved_prefix(0, commits, seen.get) == Proved(3, [], [])
    commits = log((1, ("x",)), (2, ()))
    # No gate ran above it: publication stops below it, and names it.
    assert proved_prefix(0, commits, gates(x=(True, 1)).get) == Proved(1, [], [], by_hand=2)
    # The publishing slice's gate, run again after it, proves it.
    assert proved_prefix(0, commits, gates(x=(True, 1)).get, seen_by=2) == Proved(2, [], [])
    # Compaction and a slice step's clean-up tagged with no slice change no row by hand.
    quiet = [
        Commit(1, ("x",), NOW),
        Commit(2, (), NOW, "OPTIMIZE"),
        Commit(3, (), NOW, "MERGE", True),
    ]
    assert proved_prefix(0, quiet, gates(x=(True, 1)).get) == Proved(3, [], [])
