"""The slice protocol's model (tests/unit/slice_protocol.py), explored exhaustively.

Each scenario is one of the holes a read of the code found (issue: verified means
verified under retries and concurrency). On the protocol as it was before its fix the
model must find it, with the trace; on the designed protocol it must find nothing in
any reachable state; and the shipped code's flags say which fixes have landed."""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
import slice_protocol
from slice_protocol import (
    BEFORE,
    DESIGNED,
    POINT_AFTER,
    SHIPPED,
    Copy,
    Scenario,
    explore,
    get,
    walk,
)

from slicewise.faults import POINTS

STRICT = frozenset({"strict"})
BAD = frozenset({"p"})  # breaks the pipeline's declared expectation until on-call corrects it

# name -> (scenario, {invariant the protocol before the fix breaks: the fix's flag})
HOLES = {
    # 1: X's MERGE commits, X dies before recording silver, its retry marks X again
    # above its own rows, and Y's publication then passes over them.
    "retried ingest": (
        Scenario("retried-ingest", (Copy("a", 0, 0, "X", BAD), Copy("b", 0, 1, "Y")), kills=1),
        {"unproved_gold": "verified_from_commits", "unproved_group": "ack_below_unpublished"},
    ),
    # 2: two pipelines on one topic sharing one ledger: loose's pass clears strict's mark.
    "two pipelines, one topic": (
        Scenario(
            "two-pipelines-one-topic",
            (Copy("a", 0, 0, "X", STRICT), Copy("b", 0, 1, "Y")),
            pipelines=("loose", "strict"),
            kills=0,
            attempts=1,
            parallel=1,
        ),
        {"unproved_gold": "ledger_per_pipeline", "unproved_asset": "ledger_per_pipeline"},
    ),
    # 3: a replay under stricter rules keeps the copy it quarantines when the slice
    # holds another valid copy of the key.
    "replay keeps a quarantined copy": (
        Scenario(
            "replay-keeps",
            (Copy("a", 0, 0, "X", strict_invalid=True), Copy("a", 0, 1, "X")),
            kills=0,
            attempts=1,
            replay="X",
        ),
        {"quarantined_and_stored": "replay_by_position"},
    ),
    # 4: a replay deletes a key whose other copy lives in a slice whose bronze was dropped.
    "replay deletes a key": (
        Scenario(
            "replay-deletes",
            (Copy("a", 0, 0, "X", strict_invalid=True), Copy("a", 1, 1, "Z")),
            kills=0,
            attempts=1,
            replay="X",
            drop_bronze="Z",
        ),
        {"not_oracle": "replay_refuses_dropped"},
    ),
    # 5: two slices with copies of a key far apart: S looks up before X's ids, X's
    # MERGE commits first at its own date, S's MERGE never read it, Delta sees no
    # conflict. With a kill, a retry whose MERGE Delta skips must still catch it.
    "far copies racing": (
        Scenario(
            "far-race",
            (Copy("a", 0, 0, "X"), Copy("a", 5, 1, "S")),
            kills=1,
            killable=frozenset({"ingest"}),
            attempts=2,
            publish=False,
        ),
        {"duplicate_key": "far_recheck"},
    ),
    # 6: A takes its verified version, B publishes a newer one over the same date, and
    # A's older view then replaces it.
    "gold moves backwards": (
        Scenario(
            "gold-backwards", (Copy("a", 0, 0, "A"), Copy("b", 0, 1, "B")), kills=0, attempts=1
        ),
        {"gold_backwards": "gold_fenced"},
    ),
    # 7: a retry and its zombie: the first attempt runs on beside its retry.
    "zombie ingest": (
        Scenario(
            "zombie-ingest",
            (Copy("a", 0, 0, "X", BAD), Copy("b", 0, 1, "Y")),
            kills=1,
            zombies=True,
            parallel=3,
        ),
        {"unproved_gold": "verified_from_commits"},
    ),
    # 8: far copies, and a zombie ingest of S whose clean-up of the key stored twice
    # commits after S's retry passed its gate: tagged with S, it held X's publication
    # for a gate of S nobody would run again.
    "zombie cleans up after its gate": (
        Scenario(
            "zombie-settles",
            (Copy("a", 5, 0, "S"), Copy("a", 0, 1, "X")),
            kills=1,
            killable=frozenset({"ingest"}),
            zombies=True,
            parallel=3,
        ),
        {"wedged": "settle_tags_unproved"},
    ),
    # 9 (issue 93, 1): the scheduler skips Y (catchup off, an outage, a paused DAG): X
    # and Z publish, the group walks the slices that exist past Y, and Y's records are
    # in no slice with every task green.
    "skipped interval": (
        Scenario(
            "skipped-interval",
            (Copy("a", 0, 0, "X"), Copy("b", 0, 1, "Y"), Copy("c", 0, 2, "Z")),
            skipped=frozenset({"Y"}),
            kills=0,
            attempts=1,
        ),
        {"unowned_passed": "covers_topic"},
    ),
    # ... and, with nothing published yet, on-call's rerun of every red task finds none
    # (nothing named Y): its records stay in no slice.
    "skipped interval, nothing to refuse": (
        Scenario(
            "skipped-unnamed",
            (Copy("a", 0, 0, "X"), Copy("b", 0, 1, "Y"), Copy("c", 0, 2, "Z")),
            skipped=frozenset({"Y"}),
            kills=0,
            attempts=1,
            publish=False,
        ),
        {"unowned": "covers_topic"},
    ),
    # 10 (issue 93, 3): F's ingest is refused (data loss) until the override, G
    # publishes, and the group's offsets expire: the walk from the latest page passed F.
    "group expires past a refused slice": (
        Scenario(
            "group-expires",
            (Copy("a", 0, 0, "F"), Copy("b", 0, 1, "G")),
            refused="F",
            group_expires=True,
            kills=0,
            attempts=1,
        ),
        {"unproved_group": "ack_from_ledger"},
    ),
}


@pytest.mark.parametrize("hole", HOLES)
def test_the_model_finds_each_hole_in_the_protocol_before_its_fix(hole: str) -> None:
    scenario, broken = HOLES[hole]
    report = explore(scenario, BEFORE)
    assert set(broken) <= report.found, report.describe()


# `explore`, made once per scenario and protocol in this process (the search is
# deterministic). The shipped protocol is the designed one unless a fix is OPEN, so the
# tests of each share one search (the file runs on one worker: --dist loadfile). Only
# for tests that patch nothing.
explored = functools.cache(explore)


@pytest.mark.parametrize("hole", HOLES)
def test_the_designed_protocol_holds_in_every_reachable_state(hole: str) -> None:
    scenario, _ = HOLES[hole]
    started = time.monotonic()
    report = explored(scenario, DESIGNED)
    print(f"{report.describe()} in {time.monotonic() - started:.1f} s")
    assert report.quiet > 0  # the search reached the end of the scenario
    assert not report.found, report.describe()


# The fixes the code does not ship yet: their holes are still open in it.
OPEN: set[str] = set()


def test_the_shipped_flags_are_the_fixes_that_landed() -> None:
    open_now = {name for name, on in vars(DESIGNED).items() if on and not getattr(SHIPPED, name)}
    assert open_now == OPEN


@pytest.mark.parametrize("hole", [h for h, (_, b) in HOLES.items() if set(b.values()) - OPEN])
def test_the_shipped_protocol_closes_the_holes_its_fixes_close(hole: str) -> None:
    scenario, broken = HOLES[hole]
    closed = {invariant for invariant, fix in broken.items() if fix not in OPEN}
    report = explored(scenario, SHIPPED)
    assert report.quiet > 0
    assert not closed & report.found, report.describe()


# A replay cut off between any two of its writes, then run again: the rerun must find
# the same keys, though the first attempt's withdrawal left no row of them (a: Z's copy
# must take its place; b: X's other copy, valid still, must replace the one it
# quarantines now).
REPLAY_CUT_OFF = Scenario(
    "replay-cut-off",
    (
        Copy("a", 0, 0, "X", strict_invalid=True),
        Copy("b", 0, 1, "X", strict_invalid=True),
        Copy("b", 0, 2, "X"),
        Copy("a", 0, 3, "Z"),
    ),
    kills=1,
    killable=frozenset({"replay"}),
    attempts=1,
    replay="X",
)


@pytest.mark.parametrize("proto", [DESIGNED, SHIPPED], ids=["designed", "shipped"])
def test_a_replay_cut_off_and_run_again_ends_as_if_it_ran_once(proto) -> None:
    report = explored(REPLAY_CUT_OFF, proto)
    assert report.quiet > 0
    assert not report.found & {"not_oracle", "quarantined_and_stored", "wedged"}, report.describe()


def test_a_gate_pinned_at_its_start_makes_a_publication_wait_for_a_later_slice() -> None:
    # The first cut of the rule from commits (issue 66, reverted): A's gate ran after B
    # merged, so it proved B's version, and A's publication then waited for B's gate.
    # Validating as of A's own last commit, A waits for nobody committed after it.
    two = Scenario("later-slice", (Copy("a", 0, 0, "A"), Copy("b", 0, 1, "B")), kills=0, attempts=1)
    pinned = explore(two, replace(DESIGNED, gate_at_last_commit=False))
    assert "waits_for_later" in pinned.found, pinned.describe()
    assert not explore(two, DESIGNED).found


# A key's copies far apart, the later slice's the survivor: its MERGE moves the key's
# row from X's date to its own, so gold must be rebuilt at both.
def test_settle_reusing_a_lookup_older_than_the_ids_is_caught(monkeypatch) -> None:
    # The control for `settle_reuses_lookup`: had the clean-up reused the first lookup
    # though another slice recorded ids since, the far copies racing stay twice.
    scenario, _ = HOLES["far copies racing"]
    monkeypatch.setattr(slice_protocol, "ids_unchanged", lambda w, p, before: True)
    assert "duplicate_key" in explore(scenario, DESIGNED).found


FAR_PUBLISHED = Scenario(
    "far-published",
    (Copy("b", 0, 0, "X"), Copy("a", 0, 3, "X"), Copy("a", 5, 1, "S")),
    kills=1,
    killable=frozenset({"ingest"}),
)


def test_publication_from_the_gates_reach_leaves_gold_as_silver() -> None:
    report = explore(FAR_PUBLISHED, SHIPPED)
    assert report.quiet > 0
    assert not report.found, report.describe()


def test_gold_goes_stale_when_a_publication_skips_the_far_dates(monkeypatch) -> None:
    # The check `stale_gold` bites: a gate that recorded only its own window.
    real = slice_protocol.gate_check

    def window_only(m, w, p, s, version, recorded=None):
        ok, rows, _ = real(m, w, p, s, version, recorded)
        return ok, rows, frozenset(m.window({d for (t, _, d) in get(w.ids, p) if t == s}))

    monkeypatch.setattr(slice_protocol, "gate_check", window_only)
    assert "stale_gold" in explore(FAR_PUBLISHED, SHIPPED).found


def test_a_gate_proving_a_reach_without_the_far_dates_is_caught(monkeypatch) -> None:
    # The control: had ingest recorded only the slice's own window, a gate proving it
    # misses the far row (its slice fails for ever, and gold goes stale).
    real = slice_protocol.gate_check

    def window_only(m, w, p, s, version, recorded=None):
        if recorded is not None:
            recorded = frozenset(m.window({d for (t, _, d) in get(w.ids, p) if t == s}))
        return real(m, w, p, s, version, recorded)

    monkeypatch.setattr(slice_protocol, "gate_check", window_only)
    assert {"wedged", "stale_gold"} <= explore(FAR_PUBLISHED, DESIGNED).found


def test_the_model_names_the_codes_fault_points() -> None:
    code = Path(__file__).parents[2] / "include" / "slicewise"
    called = {
        m.group(1)
        for f in code.rglob("*.py")
        for m in re.finditer(r'fault_point\(\s*"([a-z_.]+)"', f.read_text())
    }
    called |= {
        m.group(1)
        for f in code.rglob("*.py")
        for m in re.finditer(r'fault_point\("([a-z_.]+)", settings', f.read_text())
    }
    assert set(POINTS) == called == set(POINT_AFTER.values())


# A and C hold copies of `a` far apart and race: neither MERGE reads the other's date,
# and silver stores `a` twice. Z's copy beats both, and Z's window reaches both dates
# (its own keys `b` and `c` lie at either end): its MERGE replaces each row with its
# copy, so `a` is stored twice as the same copy. Each fix alone closes one way this
# broke (tests/integration/test_edges.py runs it on the real tables):
COPY_STORED_TWICE = Scenario(
    "copy-stored-twice",
    (
        Copy("a", 5, 0, "Z"),
        Copy("a", 0, 1, "A"),
        Copy("a", 10, 2, "C"),
        Copy("b", 0, 3, "Z"),
        Copy("c", 10, 4, "Z"),
    ),
    kills=0,
    attempts=1,
    parallel=3,
    publish=False,
)
TWICE = {
    # Z found no far date, so nothing cleaned up after it: `a` stays twice.
    "settle_after_copies": "duplicate_key",
    # The clean-up deleted the losers by Kafka position, which named both rows: `a` lost.
    "settle_keeps_one": "not_oracle",
    # C's gate proves silver at C's own commit, where `a` had two rows: it failed for ever.
    "gate_falls_back_to_now": "wedged",
}


@pytest.mark.parametrize("fix", TWICE)
def test_without_each_fix_a_copy_stored_twice_breaks_the_protocol(fix: str) -> None:
    report = explore(COPY_STORED_TWICE, replace(DESIGNED, **{fix: False}))
    assert TWICE[fix] in report.found, report.describe()


def test_a_copy_stored_twice_ends_as_one_row_and_every_gate_passes() -> None:
    report = explore(COPY_STORED_TWICE, SHIPPED)
    assert report.quiet > 0
    assert not report.found, report.describe()


# Coverage's checks are one walk in the code (`slicewise.coverage`): without it, the
# cap on the version published has nothing to stop at either.
@pytest.mark.parametrize(
    ("hole", "fixes", "invariant"),
    [
        ("skipped interval", ("covers_topic", "capped_at_coverage"), "unowned_passed"),
        ("skipped interval, nothing to refuse", ("covers_topic",), "unowned"),
        ("group expires past a refused slice", ("ack_from_ledger",), "unproved_group"),
        # X in flight, Y skipped, Z gated and refused: X's publication read a version
        # holding Z's rows, past the range Y owns (the review of issue 93).
        ("skipped interval", ("capped_at_coverage",), "unowned_passed"),
    ],
)
def test_without_each_coverage_fix_the_designed_protocol_breaks(hole, fixes, invariant) -> None:
    scenario, _ = HOLES[hole]
    report = explore(scenario, replace(DESIGNED, **dict.fromkeys(fixes, False)))
    assert invariant in report.found, report.describe()


# Production's shape, too big to search whole: retries=3 (four attempts), four runs in
# flight, kills and zombies, an interval the scheduler skipped, a slice refused until
# its override, the group's offsets expiring and silver's log cleaned up. Seeded random
# walks of the model.
PRODUCTION = Scenario(
    "production",
    (
        Copy("a", 0, 0, "W"),
        Copy("b", 0, 1, "X", BAD),
        Copy("a", 3, 2, "Y"),
        Copy("c", 0, 3, "Z"),
        Copy("d", 3, 4, "V"),
    ),
    kills=3,
    zombies=True,
    attempts=4,
    parallel=4,
    skipped=frozenset({"Y"}),
    refused="Z",
    group_expires=True,
    log_cleanup=True,
)
WALK_SEEDS = range(3)  # a fixed budget in the unit tier; a long run: SLICEWISE_WALKS


@pytest.mark.parametrize("seed", WALK_SEEDS)
def test_random_walks_of_production_find_nothing_on_the_shipped_protocol(seed) -> None:
    walks = int(os.environ.get("SLICEWISE_WALKS", "150"))
    report = walk(PRODUCTION, SHIPPED, seed=seed, walks=walks)
    assert report.quiet == walks
    assert not report.found, report.describe()


def test_random_walks_find_the_skipped_interval_on_the_protocol_before() -> None:
    off = replace(SHIPPED, covers_topic=False, capped_at_coverage=False)
    report = walk(PRODUCTION, off, seed=0, walks=50)
    assert "unowned_passed" in report.found, report.describe()


# Issue 93, 10: X's gate fails, so nothing publishes; Delta's log cleanup then keeps
# silver's commits from Y's on, and Y's publication walked from there, never meeting
# X's commit: X's rejected rows reached gold. (The protocol before the commits' walk
# had no walk to cut: only the designed one without the fix shows it.)
LOG_CLEANUP = Scenario(
    "log-cleanup",
    (Copy("a", 0, 0, "X", BAD), Copy("b", 0, 1, "Y")),
    kills=1,
    attempts=2,
    log_cleanup=True,
)


def test_a_log_cleaned_up_above_the_last_publication_is_refused_until_accepted() -> None:
    report = explored(LOG_CLEANUP, SHIPPED)
    assert report.quiet > 0
    assert not report.found, report.describe()
    cut_through = explore(LOG_CLEANUP, replace(DESIGNED, refuses_truncated=False))
    assert "unproved_gold" in cut_through.found, cut_through.describe()
