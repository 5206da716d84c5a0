"""The slice protocol as a model, explored exhaustively: the spec of what every step
writes, in what order, and what must hold in every state a kill, a retry, a zombie
or a racing slice can reach.

Each step is its sequence of atomic actions on shared records (a Delta commit, a
read of a table's latest version, a ledger put, a Kafka commit), as the code issues
them; an attempt can die between any two, Airflow then starts the next attempt from
the top, and a "zombie" attempt keeps running beside its retry. `explore` walks every
interleaving of every running attempt (depth first, each state once) and checks the
invariants in every state it reaches, and at every quiet state (nothing left to
run) that an on-call's clean rerun of every unfinished task publishes everything:

* `unproved_gold`, `unproved_asset`, `unproved_group`: gold, the Asset's version and
  the consumer group never hold a row (or pass a slice) no passing gate saw;
* `duplicate_key`: silver never holds two rows of one key;
* `gold_backwards`: a date of gold is never rebuilt from an older silver version;
* `not_oracle`: once quiet, silver holds for each key the copy the survivor rule
  picks among the valid copies of the slices processed, whatever the order;
* `quarantined_and_stored`: once quiet, no copy is in quarantine and in silver;
* `waits_for_later`: a publication waits for the gate of a slice that committed after
  its own last commit (or, where its gate failed there and fell back to silver as it
  was then, after the version that gate proved);
* `wedged`: a quiet state from which the on-call's rerun does not publish every
  slice;
* `unowned_passed`: gold, the Asset or the consumer group pass an interval that no
  slice owns (one the scheduler skipped);
* `unowned`: after the on-call's rerun (which runs every interval `status` and the
  refusals name), an interval between the first and the last slice is owned by none:
  its records were never read;
* `stale_gold`: once the on-call's rerun has published every slice, a date of gold
  does not hold what silver holds there.

`Protocol` switches between what the code did before each fix and what it does
now, so the model shows each hole on the old protocol and none on the shipped one.
The labels of the actions that the code's `fault_point`s sit behind are the
code's names (`POINT_AFTER`), checked against `slicewise.faults.POINTS`.

Data: a copy is one Kafka record of a key (its position is the survivor order),
dated, valid or not under each pipeline's rules; silver is the list of its
versions, each a set of copies and the slice step that committed it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from operator import itemgetter
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Protocol:
    """What the code does; each flag is one fix (False: the code before it)."""

    # Publication reads a version every slice commit below which a passing gate saw,
    # from silver's own tagged commits and the gates' pinned versions (no marks).
    verified_from_commits: bool = False
    # ... with each gate validating silver as of its own slice's last commit (False: as
    # of the version at its start, so a slice committed in between delayed publication).
    gate_at_last_commit: bool = False
    ledger_per_pipeline: bool = False
    replay_by_position: bool = False  # a copy the new rules quarantine leaves silver
    replay_refuses_dropped: bool = False  # a replay needing a dropped slice's copies refuses
    # Gold's writes are fenced (`publish.fence`): the code's read of gold's state and its
    # write act as one step, as here, because Delta skips a write that read an older gold
    # and the publication then rebuilds.
    gold_fenced: bool = False
    far_recheck: bool = False  # the MERGE looks for far dates again after its commit
    # ... unless `slice_ids` has not changed since the first lookup read it (its version
    # read before that lookup, and again after silver's version is read for the record):
    # the lookup would find what the first one found. Not a fix: one far-date lookup
    # fewer a slice, which the invariants must show loses nothing. (The model reuses the
    # lookup wherever the ids are as they were, a superset of where the code does.)
    settle_reuses_lookup: bool = False
    # ... and tags its clean-up with the slice itself only while its gate has not passed
    # (False: always; a zombie's clean-up after its retry's gate then held every later
    # publication for a gate nobody would run again).
    settle_tags_unproved: bool = False
    ack_below_unpublished: bool = False  # the group stops below the first unpublished slice
    # Publication rebuilds the dates of the reach its slice's passing gate recorded (False:
    # it looks the reach up again). Not a fix: one far-date lookup fewer a slice, which
    # `stale_gold` must show loses nothing.
    reach_of_gate: bool = False
    # The gate proves the reach the slice's ingest looked up after its MERGE, where it
    # validates silver at or below the version ingest read just before that lookup and
    # no replay of the slice has run (False: it looks the far dates up again). Not a
    # fix: one far-date lookup fewer a slice, which the invariants must show loses
    # nothing. A commit above that version (a clean-up, a replay's bring-in tagged with
    # the slice, a third slice moving one of its keys) sends the gate to a lookup.
    gate_reach_of_silver: bool = False
    # A clean-up of a key stored twice deletes every row of the key it read and writes
    # the survivor back once (False: it deleted the losers by Kafka position, which also
    # deleted the survivor where a MERGE had copied it onto two rows: the key was lost).
    settle_keeps_one: bool = False
    # The MERGE's own metrics tell when it replaced several rows of a key (a copy written
    # twice): the clean-up then runs whatever the far dates (and after a MERGE Delta
    # skipped, whose metrics are gone). False: only where far dates exist.
    settle_after_copies: bool = False
    # A gate failing at its slice's last commit validates silver as it is now: a later
    # commit may have removed the duplicate its slice's racing MERGE left (False: it
    # failed at that version for ever).
    gate_falls_back_to_now: bool = False
    # Slices cover the topic (`slicewise.coverage`): publication waits for, then refuses,
    # an interval before its slice that no slice owns, `status` names it, and the group's
    # walk stops below it (False: planning froze only the run's own interval and the
    # group walked the slices that exist, so a skipped interval was passed in silence).
    covers_topic: bool = False
    # The group's walk starts at the ledger's own `acknowledged` mark and every
    # publication commits the run's end again (False: it started from the slice the
    # group's committed offsets named, read back, and from the latest page of slices
    # when they named none: an expired or reset group was moved past a slice waiting).
    ack_from_ledger: bool = False
    # The version publication reads stops below the first commit of a slice that lies
    # past a range no slice owns (False: any passing gate's commit counted, so an
    # earlier slice's publication carried a later, refused one's rows downstream).
    capped_at_coverage: bool = False
    # Publication refuses a silver log that Delta's cleanup cut above the last published
    # version until on-call accepts it, every gate passed (False: it walked from the
    # oldest commit left and never met a failed slice's commit below it).
    refuses_truncated: bool = False


BEFORE = Protocol()
# The protocol the model proves (every fix); the code ships `SHIPPED`.
DESIGNED = Protocol(
    verified_from_commits=True,
    gate_at_last_commit=True,
    ledger_per_pipeline=True,
    replay_by_position=True,
    replay_refuses_dropped=True,
    gold_fenced=True,
    far_recheck=True,
    settle_reuses_lookup=True,
    settle_tags_unproved=True,
    ack_below_unpublished=True,
    reach_of_gate=True,
    gate_reach_of_silver=True,
    settle_keeps_one=True,
    settle_after_copies=True,
    gate_falls_back_to_now=True,
    covers_topic=True,
    ack_from_ledger=True,
    capped_at_coverage=True,
    refuses_truncated=True,
)
# What the code ships: every designed flag but those still open (`OPEN` in the tests).
SHIPPED = DESIGNED


class Copy(NamedTuple):
    key: str
    date: int
    pos: int  # Kafka position: the survivor is the lowest
    slice: str
    bad_for: frozenset[str] = frozenset()  # pipelines whose declared expectation it breaks
    strict_invalid: bool = False  # quarantined once the rules turn strict
    # A second row of the same copy: Delta's MERGE updates every stored row a source
    # row matches, so a copy that beats two rows of its key is then stored twice.
    twin: int = 0

    def __repr__(self) -> str:
        twin = f"'{self.twin}" if self.twin else ""
        return f"{self.slice}:{self.key}@day{self.date}#{self.pos}{twin}"


@dataclass(frozen=True)
class Scenario:
    """What can happen: the slices (in schedule order) and their copies, the pipelines
    reading the topic, kills, retries, zombies, and the operator's actions."""

    name: str
    copies: tuple[Copy, ...]
    pipelines: tuple[str, ...] = ("p",)
    kills: int = 1  # attempts that may die, over the whole run
    killable: frozenset[str] | None = None  # the steps whose attempts may die (None: all)
    attempts: int = 2  # per task
    zombies: bool = False  # a killed attempt may run on beside its retry
    replay: str | None = None  # the slice replayed once its rules turn strict
    drop_bronze: str | None = None  # a published slice whose bronze maintenance drops
    publish: bool = True  # run publish and announce
    parallel: int = 2  # attempts running at once (Airflow's pool)
    # Intervals the scheduler creates no run for (catchup off after an outage, a paused
    # DAG); each runs only if an operator backfills it.
    skipped: frozenset[str] = frozenset()
    # A slice whose ingest is refused (a data-loss report) until on-call's override.
    refused: str | None = None
    group_expires: bool = False  # the group's offsets expire (or are reset) once
    log_cleanup: bool = False  # Delta's log cleanup removes silver's commits but the latest

    @cached_property  # asked in every state the search reaches
    def slices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.slice for c in sorted(self.copies, key=lambda c: c.pos)))


# -- an immutable map, so a state is hashable ------------------------------------
def get(m: tuple, k: Any, default: Any = None) -> Any:
    for key, v in m:
        if key == k:
            return v
    return default


_KEY = itemgetter(0)


def put(m: tuple, k: Any, v: Any) -> tuple:
    items = [kv for kv in m if kv[0] != k]
    items.append((k, v))
    items.sort(key=_KEY)
    return tuple(items)


def drop(m: tuple, k: Any) -> tuple:
    return tuple((key, x) for key, x in m if key != k)


class World(NamedTuple):
    silver: tuple  # pipeline -> tuple of versions: (frozenset[Copy], (slice, what) | None)
    ids: tuple  # pipeline -> frozenset of (slice, key, date): `slice_ids`
    quarantine: tuple  # pipeline -> frozenset[Copy]
    appended: frozenset  # (pipeline, table, slice): idempotent appends and MERGE ids done
    ledger: tuple  # (ledger, record, slice) -> value
    gold: tuple  # pipeline -> ((date -> (built_from, frozenset[Copy])), gold version)
    group: tuple  # pipeline -> index of the newest slice the group passed (-1: none)
    proved: frozenset  # (pipeline, Copy) a passing gate saw in silver
    strict: frozenset  # pipelines whose rules turned strict
    repaired: bool  # the failing expectation was corrected by on-call
    tasks: tuple  # (pipeline, slice, step) -> (attempts, outcome)
    running: tuple  # attempts: (pipeline, slice, step, attempt, pc, locals)
    kills: int
    done: frozenset  # operator actions done
    cut: tuple = ()  # pipeline -> silver's oldest version whose commit the log still holds


STEPS = ("plan", "ingest", "gate", "publish", "announce")
# (step, pc): the code's fault point right after that action (`slicewise.faults.POINTS`)
POINT_AFTER = {
    ("plan", 0): "plan.resolved",
    ("ingest", 0): "bronze.committed",
    ("ingest", 3): "silver.quarantined",
    ("ingest", 5): "silver.merging",
    ("ingest", 6): "silver.merged",
    ("gate", 3): "gate.validated",
    ("publish", 2): "publish.gold_written",
    ("announce", 0): "announce.recorded",
}


def initial(sc: Scenario) -> World:
    empty = frozenset()
    return World(
        silver=tuple((p, ((empty, None),)) for p in sc.pipelines),
        ids=tuple((p, empty) for p in sc.pipelines),
        quarantine=tuple((p, empty) for p in sc.pipelines),
        appended=empty,
        ledger=(),
        gold=tuple((p, ((), -1)) for p in sc.pipelines),
        group=tuple((p, -1) for p in sc.pipelines),
        proved=empty,
        strict=empty,
        repaired=False,
        tasks=(),
        running=(),
        kills=0,
        done=empty,
    )


class Violation(Exception):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant, self.detail = invariant, detail


# -- what the tables hold -------------------------------------------------------
@dataclass
class Model:
    sc: Scenario
    proto: Protocol

    def ledger_of(self, p: str) -> str:
        return p if self.proto.ledger_per_pipeline else "topic"

    def rec(self, w: World, p: str, record: str, s: str) -> Any:
        return get(w.ledger, (self.ledger_of(p), record, s))

    def set_rec(self, w: World, p: str, record: str, s: str, v: Any) -> World:
        return w._replace(ledger=put(w.ledger, (self.ledger_of(p), record, s), v))

    def del_rec(self, w: World, p: str, record: str, s: str) -> World:
        return w._replace(ledger=drop(w.ledger, (self.ledger_of(p), record, s)))

    def recs(self, w: World, p: str, record: str) -> dict[str, Any]:
        lg = self.ledger_of(p)
        return {s: v for (l2, r, s), v in w.ledger if l2 == lg and r == record}

    def valid(self, w: World, p: str, c: Copy) -> bool:
        return not (c.strict_invalid and p in w.strict)

    def bad(self, w: World, p: str, c: Copy) -> bool:
        return p in c.bad_for and not w.repaired

    def survivors(self, w: World, p: str, s: str) -> dict[str, Copy]:
        best: dict[str, Copy] = {}
        for c in self.sc.copies:
            if c.slice == s and self.valid(w, p, c):
                if c.key not in best or c.pos < best[c.key].pos:
                    best[c.key] = c
        return best

    def versions(self, w: World, p: str) -> tuple:
        return get(w.silver, p)

    def rows(self, w: World, p: str, version: int | None = None) -> frozenset[Copy]:
        vs = self.versions(w, p)
        return vs[-1 if version is None else version][0]

    def commit(self, w: World, p: str, rows: frozenset[Copy], by: tuple | None) -> World:
        vs = self.versions(w, p)
        if rows == vs[-1][0] and by is None:
            return w
        return w._replace(silver=put(w.silver, p, (*vs, (rows, by))))

    def check_unique(self, w: World, p: str, version: int | None = None) -> None:
        rows = self.rows(w, p, version)
        keys = [c.key for c in rows]
        if len(keys) != len(set(keys)):
            raise Violation("duplicate_key", f"{p} silver v{version}: {sorted(rows)}")

    def window(self, dates: set[int]) -> set[int]:
        """A slice's own event dates at the default horizon of 0 (`windows.own_reach`):
        the dates its events carry, not the days between them."""
        return set(dates)

    def reach(self, w: World, p: str, s: str, keys: set[str], dates: set[int]) -> set[int]:
        """The slice's window and the far dates `slice_ids` records for its keys."""
        window = self.window(dates)
        far = {d for (_, k, d) in get(w.ids, p) if k in keys and d not in window}
        return window | far

    def merged_rows(self, rows: frozenset, src: dict[str, Copy], reach: set[int]) -> frozenset:
        """silver's MERGE: within the reach, a key's stored copy is replaced only by one
        that beats it; a key with no stored copy there is inserted."""
        out = set(rows)
        for k, c in src.items():
            stored = [r for r in rows if r.key == k and r.date in reach]
            if not stored:
                out.add(c)
            for r in stored:
                if c.pos < r.pos:
                    out.discard(r)
                    twins = [x.twin for x in out if x.key == k and x.pos == c.pos]
                    out.add(c._replace(twin=max(twins, default=-1) + 1))
        return frozenset(out)

    def copied(self, rows: frozenset, src: dict[str, Copy], reach: set[int]) -> bool:
        """Whether the MERGE replaces two or more stored rows of one key (its metrics:
        more rows updated and inserted than it had source rows)."""
        return any(
            sum(1 for r in rows if r.key == k and r.date in reach and c.pos < r.pos) > 1
            for k, c in src.items()
        )

    def touched(self, w: World, p: str, since: int) -> set[int]:
        """The dates commits after version `since` changed (Delta's conflict check)."""
        vs = self.versions(w, p)
        out: set[int] = set()
        for a, b in zip(vs[since:], vs[since + 1 :], strict=False):
            out |= {c.date for c in a[0] ^ b[0]}
        return out

    # -- invariants on what leaves the pipeline ------------------------------
    def check_gold(self, w: World, p: str) -> None:
        dates, _ = get(w.gold, p)
        for d, (_, rows) in dates:
            for c in rows:
                if (p, c) not in w.proved:
                    raise Violation("unproved_gold", f"{p} gold date {d} holds {c}, no gate saw it")

    def check_owned(self, w: World, p: str, s: str, version: int) -> None:
        """Nothing published past a range no slice owns: not the slice, nor rows of a
        later slice in the silver version it publishes."""
        for x in {s} | {c.slice for c in self.rows(w, p, version)}:
            if gap := unowned_before(self, w, p, x):
                raise Violation(
                    "unowned_passed", f"{p} published {s} (v{version}) with {x}, past {gap}"
                )

    def check_version(self, w: World, p: str, version: int, what: str) -> None:
        if version >= len(self.versions(w, p)):
            raise Violation(what, f"{p} announced silver v{version}, which it does not have")
        self.check_unique(w, p, version)
        for c in self.rows(w, p, version):
            if (p, c) not in w.proved:
                raise Violation(what, f"{p} silver v{version} holds {c}, no gate saw it")


# -- the steps, as the code issues their writes -----------------------------------
# Each action takes (model, world, pipeline, slice, locals) and returns
# (world, locals, next pc | "ok" | "failed"). Labels name the points between actions
# where the code has a fault point.


def plan(m: Model, w: World, p: str, s: str, pc: int, loc: tuple) -> tuple:
    """The slice frozen in the ledger (a create that keeps the first one's answer)."""
    return m.set_rec(w, p, "slice", s, True), (), "ok"


def ids_unchanged(w: World, p: str, before: frozenset) -> bool:
    """`slice_ids` as the first far-date lookup read it (the code: its version then)."""
    return get(w.ids, p) == before


def ingest(m: Model, w: World, p: str, s: str, pc: int, loc: tuple) -> tuple:
    proto = m.proto
    if pc == 0:  # bronze: the one Kafka read, appended once
        if s == m.sc.refused and not w.repaired:
            return w, (), "failed"  # DataLossError until the override
        w = w._replace(appended=w.appended | {(p, "bronze", s)})
        return w, loc, 1  # bronze.committed
    if pc == 1:  # silver recorded already? (the MERGE's id then spent)
        return w, (m.rec(w, p, "silver", s) is not None,), 2
    if pc == 2:  # mark unverified, with silver's version then
        if not proto.verified_from_commits and not loc[0]:
            w = m.set_rec(w, p, "mark", s, len(m.versions(w, p)) - 1)
        return w, (), 3
    if pc == 3:  # quarantine, appended once
        if (p, "quarantine", s) not in w.appended:
            bad = {c for c in m.sc.copies if c.slice == s and not m.valid(w, p, c)}
            w = w._replace(
                quarantine=put(w.quarantine, p, get(w.quarantine, p) | bad),
                appended=w.appended | {(p, "quarantine", s)},
            )
        return w, (), 4  # silver.quarantined
    if pc == 4:  # slice_ids, appended once
        if (p, "slice_ids", s) not in w.appended:
            mine = {(s, c.key, c.date) for c in m.survivors(w, p, s).values()}
            w = w._replace(
                ids=put(w.ids, p, get(w.ids, p) | mine), appended=w.appended | {(p, "slice_ids", s)}
            )
        return w, (), 5
    if pc == 5:  # the far-date lookup, then the MERGE reads silver at its version
        src = m.survivors(w, p, s)
        reach = m.reach(w, p, s, set(src), {c.date for c in src.values()})
        return w, (frozenset(reach), len(m.versions(w, p)) - 1, get(w.ids, p)), 6
    if pc == 6:  # the MERGE commits (silver.merging sits just before it)
        reach, read, ids = loc
        if (p, "merge", s) in w.appended:  # Delta skips a spent idempotent-write id
            # ... and the first attempt's commit keeps its metrics in silver's history
            return w, (reach, (p, "copied", s) in w.appended, ids), 7
        if m.touched(w, p, read) & reach:  # a conflict: retry_on_conflict reruns silver
            return w, (), 1
        src = m.survivors(w, p, s)
        copied = m.copied(m.rows(w, p), src, set(reach))
        rows = m.merged_rows(m.rows(w, p), src, set(reach))
        w = m.commit(w, p, rows, (s, "merge"))
        w = w._replace(
            appended=w.appended | {(p, "merge", s)} | ({(p, "copied", s)} if copied else set())
        )
        return w, (reach, copied, ids), 7
    if pc == 7:  # silver.merged; then (shipped) the far dates again, silver's version read first
        # The version is read before the lookup, so every commit at or below it came
        # before the lookup: a gate pinned at or below it may prove this reach.
        version = len(m.versions(w, p)) - 1
        if not proto.far_recheck:  # the reach as the MERGE looked it up
            return w, (loc[0], version, False), 9
        src = m.survivors(w, p, s)
        if proto.settle_reuses_lookup and ids_unchanged(w, p, loc[2]):
            again = loc[0]  # no slice recorded ids since the first lookup: the same dates
        else:
            again = m.reach(w, p, s, set(src), {c.date for c in src.values()})
        check = bool(again - m.window({c.date for c in src.values()}))
        check = check or (proto.settle_after_copies and loc[1])
        return w, (frozenset(again), version, check), 8
    if pc == 8:  # where far dates exist, each key keeps its survivor only
        # Looked up again after the commit: a racing slice that recorded its ids after
        # this one's lookup and merged first, far away, is found now. Wherever far
        # dates exist each key keeps its survivor only, whatever this attempt's MERGE
        # read (a retry's MERGE may have been the first attempt's, skipped by Delta).
        again, _, check = loc
        src = m.survivors(w, p, s)
        if check:
            rows = m.rows(w, p)
            losers, back, owners = set(), set(), set()
            for k in src:
                same = sorted(
                    (c for c in rows if c.key == k and c.date in again),
                    key=lambda c: (c.pos, c.twin),
                )
                if len(same) > 1:
                    if proto.settle_keeps_one:  # every row read goes; the survivor comes back
                        losers |= set(same)
                        back.add(same[0]._replace(twin=0))
                    else:  # deleted by position: a twin of the survivor takes it along
                        beaten = {c.pos for c in same[1:]}
                        losers |= {c for c in same if c.pos in beaten}
                    owners |= {c.slice for c in same}
            # Tagged with each other slice holding a row of such a key whose gate has
            # not passed: its gate, pinned at its own last commit, may have seen the
            # two rows, and must see the one now. One whose gate passed saw one row
            # (tagging it would hold its publication for a gate it passed).
            if losers:
                unproved = {o for o in owners if not (m.rec(w, p, "gate", o) or (False,))[0]}
                if not proto.settle_tags_unproved:
                    unproved.add(s)
                # A clean-up only deletes rows and writes back one a gate saw: with every
                # owner's gate passed (each saw one row), no gate must see it, and its
                # tag names no slice.
                w = m.commit(w, p, rows - losers | back, ("", "settle", frozenset(unproved)))
        return w, loc, 9
    if pc == 9:  # record silver: the version read before the lookup, and the reach it found
        reach, version = loc[:2]
        w = m.set_rec(w, p, "silver", s, version)
        w = m.set_rec(w, p, "silver_reach", s, (frozenset(reach), version))
        w = m.set_rec(w, p, "applied", s, p in w.strict)
        return w, (), "ok"
    raise AssertionError(pc)


def gate_check(
    m: Model, w: World, p: str, s: str, version: int, recorded: frozenset | None = None
) -> tuple[bool, frozenset, frozenset]:
    """The gate's facts on silver at `version`: the slice's recorded keys in its reach
    (`recorded`, else looked up now), each once, present, and no row breaking an
    expectation. Returns (passed, rows seen, the reach)."""
    ids = [(k, d) for (sid, k, d) in get(w.ids, p) if sid == s]
    keys = {k for k, _ in ids}
    reach = recorded if recorded is not None else m.reach(w, p, s, keys, {d for _, d in ids})
    rows = frozenset(c for c in m.rows(w, p, version) if c.key in keys and c.date in reach)
    stored = [c.key for c in rows]
    ok = len(stored) == len(set(stored)) and set(stored) == keys
    ok = ok and not any(m.bad(w, p, c) for c in rows)
    return ok, rows, frozenset(reach)


def gate(m: Model, w: World, p: str, s: str, pc: int, loc: tuple) -> tuple:
    if pc == 0:  # silver recorded?
        if m.rec(w, p, "silver", s) is None:
            return w, (), "failed"
        return w, (), 1
    if pc == 1:  # validate silver (as it is; from commits: as of the slice's last commit)
        version, recorded = len(m.versions(w, p)) - 1, None
        if m.proto.verified_from_commits and m.proto.gate_at_last_commit:
            last = last_commit(m, w, p, s, version)
            if last:  # pinned at its own last commit
                version = last
        # The reach ingest recorded holds when every commit up to the version validated
        # came before its lookup, and no replay has changed the slice's keys since.
        kept = m.rec(w, p, "silver_reach", s)
        if (
            m.proto.gate_reach_of_silver
            and kept is not None
            and version <= kept[1]
            and m.rec(w, p, "replay", s) is None
        ):
            recorded = kept[0]
        ok, rows, reach = gate_check(m, w, p, s, version, recorded)
        now = len(m.versions(w, p)) - 1
        fell_back = not ok and version < now and m.proto.gate_falls_back_to_now
        if fell_back:
            version = now
            ok, rows, reach = gate_check(m, w, p, s, version)
        if ok:
            w = w._replace(proved=w.proved | {(p, c) for c in rows})
        return w, (ok, version, reach if m.proto.reach_of_gate else None, fell_back), 2
    if pc == 2:  # on a pass, clear the mark first
        if loc[0] and not m.proto.verified_from_commits:
            w = m.del_rec(w, p, "mark", s)
        return w, loc, 3
    if pc == 3:  # record the outcome (and the version it proved)
        w = m.set_rec(w, p, "gate", s, loc)
        return w, loc, 4  # gate.validated
    if pc == 4:
        return w, (), "ok" if loc[0] else "failed"
    raise AssertionError(pc)


def gated(by: tuple | None) -> tuple[str, ...]:
    """The slices whose gate must see a commit's rows (its tag)."""
    if by is None:
        return ()
    return tuple(s for s in (by[0], *(by[2] if len(by) > 2 else ())) if s)


def floor(m: Model, w: World, p: str) -> int:
    """The newest version a publication read: proved, so walks start above it."""
    return max([v for v in m.recs(w, p, "publish").values()], default=0)


def last_commit(m: Model, w: World, p: str, s: str, upto: int) -> int | None:
    """The newest commit above the floor, at or below `upto`, tagged with `s`, among those
    the log still holds."""
    vs = m.versions(w, p)
    first = max(floor(m, w, p) + 1, get(w.cut, p, 0))
    found = [v for v in range(first, upto + 1) if s in gated(vs[v][1])]
    return found[-1] if found else None


def verified_from_commits(m: Model, w: World, p: str, s: str) -> tuple[str, Any]:
    """The shipped rule: the newest version V such that every slice commit at or below V
    (above the newest version already published) was seen by a passing gate of its
    slice, pinned at a version at or below V. ("ok", V) | ("wait", slices) |
    ("failed", slices)."""
    vs = m.versions(w, p)
    current = len(vs) - 1
    need = best = floor(m, w, p)
    pending, failed = [], []
    cut = get(w.cut, p, 0)
    if cut > best + 1 and m.proto.refuses_truncated:
        # HistoryTruncated, until on-call accepts it; the acceptance itself is refused
        # while a slice that merged has no passing gate.
        unproved = [
            x
            for x in m.sc.slices
            if (p, "bronze", x) in w.appended and not (m.rec(w, p, "gate", x) or (False,))[0]
        ]
        if not w.repaired or unproved:
            return "failed", unproved or ["history"]
    for v in range(max(best + 1, cut), current + 1):
        for t in gated(vs[v][1]):
            outcome = m.rec(w, p, "gate", t)
            if m.proto.capped_at_coverage and unowned_before(m, w, p, t):
                pending.append(t)  # waits for the range before it (a timeout refuses)
            elif outcome is None or not outcome[0] or outcome[1] < v:
                (failed if outcome is not None and not outcome[0] else pending).append(t)
            else:
                need = max(need, outcome[1])
        if failed or pending:
            break
        if v >= need:
            best = v
    mine = last_commit(m, w, p, s, current)
    if mine is None or best >= mine:
        return "ok", best
    if failed:
        return "failed", failed
    # Liveness: a publication waits only for gates of slices that committed before its
    # own last commit (or before the version its own gate proved, when that gate failed
    # there and fell back to silver as it was then: a bound fixed once). Waiting on a
    # later one, it could wait for ever behind a pipeline that keeps committing (the
    # rule pinned at the gate's start did: issue 66).
    own = m.rec(w, p, "gate", s)
    if v > (max(mine, own[1]) if own and own[0] and own[3] else mine):
        raise Violation("waits_for_later", f"{p} publish of {s} (v{mine}) waits for v{v}")
    return "wait", pending


def publish(m: Model, w: World, p: str, s: str, pc: int, loc: tuple) -> tuple:
    proto = m.proto
    if pc == 0:  # the gate passed since the last MERGE?
        outcome = m.rec(w, p, "gate", s)
        if not outcome or not outcome[0]:
            return w, (), "failed"
        if proto.verified_from_commits:
            mine = last_commit(m, w, p, s, len(m.versions(w, p)) - 1)
            if mine is not None and outcome[1] < mine:
                return w, (), "failed"
        elif m.rec(w, p, "mark", s) is not None:
            return w, (), "failed"
        if proto.covers_topic and unowned_before(m, w, p, s):
            return w, (), 0  # waits for the interval to be planned (a timeout refuses)
        return w, (), 1
    if pc == 1:  # the verified version (waits, or is blocked)
        if proto.verified_from_commits:
            how, v = verified_from_commits(m, w, p, s)
            if how == "ok":
                return w, (v,), 2
            return w, (), "failed" if how == "failed" else 1
        marks = m.recs(w, p, "mark")
        merged = max(
            [x for x in (m.rec(w, p, "silver", s), m.rec(w, p, "replay", s)) if x is not None],
            default=None,
        )
        failed = [x for x in marks if (m.rec(w, p, "gate", x) or (None,))[0] is False]
        holding = [x for x, v in marks.items() if merged is None or v < merged]
        if failed:
            return w, (), "failed"
        if holding:
            return w, (), 1  # waits (a timeout fails it: a kill stands in for that)
        return w, (min([len(m.versions(w, p)) - 1, *marks.values()]),), 2
    if pc == 2:  # rebuild gold's dates in the reach from silver at V
        (version,) = loc
        dates_map, gold_version = get(w.gold, p)
        built = max([b for _, (b, _) in dates_map], default=-1)
        if proto.gold_fenced:
            version = max(version, built)
        if proto.reach_of_gate:
            reach = set(m.rec(w, p, "gate", s)[2])
        else:
            ids = [(k, d) for (sid, k, d) in get(w.ids, p) if sid == s]
            reach = m.reach(w, p, s, {k for k, _ in ids}, {d for _, d in ids})
        replayed = m.rec(w, p, "replay_changed", s)
        if replayed:
            reach |= set(replayed)
        m.check_unique(w, p, version)
        rows = m.rows(w, p, version)
        for d in sorted(reach):
            before = get(dates_map, d)
            if before is not None and before[0] > version:
                raise Violation(
                    "gold_backwards", f"{p} gold date {d} rebuilt from v{version} over v{before[0]}"
                )
            dates_map = put(dates_map, d, (version, frozenset(c for c in rows if c.date == d)))
        w = w._replace(gold=put(w.gold, p, (dates_map, gold_version + 1)))
        m.check_gold(w, p)
        m.check_owned(w, p, s, version)
        return w, (version,), 3  # publish.gold_written
    if pc == 3:  # record the publication
        w = m.set_rec(w, p, "publish", s, loc[0])
        return w, loc, 4
    if pc == 4:  # move the consumer group forward
        order, planned = m.sc.slices, m.recs(w, p, "slice")
        published = m.recs(w, p, "publish")
        held = get(w.group, p)
        if proto.ack_from_ledger:  # the run from the origin, as the ledger has it
            group = -1
            for i, x in enumerate(order):
                if x not in published or (proto.covers_topic and x not in planned):
                    break
                group = i
        else:
            # The slices that exist, walked from the one the group's offsets name; an
            # expired group names none, and the walk then starts at the latest page of
            # slices (here: the published slice alone).
            walk = [i for i, x in enumerate(order) if x in planned]
            if held < 0 and "group expired" in w.done:
                walk = [order.index(s)]
            walk = [i for i in walk if i > held]
            if proto.ack_below_unpublished:
                upto = -1
                for i in walk:
                    if order[i] not in published:
                        break
                    upto = i
            else:
                upto = max(order.index(x) for x in published)
            group = max(held, upto)
        for i in range(group + 1):
            x = order[i]
            outcome = m.rec(w, p, "gate", x)
            if x not in planned:
                raise Violation("unowned_passed", f"{p}'s group passed {x}, which no slice owns")
            if x not in published or not outcome or not outcome[0]:
                raise Violation("unproved_group", f"{p}'s group passed {x}, not published")
        return w._replace(group=put(w.group, p, group)), loc, "ok"
    raise AssertionError(pc)


def unowned_before(m: Model, w: World, p: str, s: str) -> str | None:
    """The first interval before `s` that no slice owns (`coverage.first_unowned`)."""
    planned = m.recs(w, p, "slice")
    order = m.sc.slices
    return next((x for x in order[: order.index(s)] if x not in planned), None)


def announce(m: Model, w: World, p: str, s: str, pc: int, loc: tuple) -> tuple:
    if pc == 0:
        version = m.rec(w, p, "publish", s)
        if version is None:
            return w, (), "failed"
        m.check_version(w, p, version, "unproved_asset")
        m.check_owned(w, p, s, version)
        return w, (), "ok"  # announce.recorded
    raise AssertionError(pc)


def holders(m: Model, w: World, p: str, s: str, keys: set[str]) -> set[str]:
    """The other slices `slice_ids` records a copy of one of `keys` for."""
    return {sid for (sid, k, _) in get(w.ids, p) if k in keys and sid != s}


def copies_of(m: Model, w: World, p: str, slices: set[str], keys: set[str]) -> dict[str, Copy]:
    """Per key, the survivor among those slices' valid copies (read from their bronze)."""
    best: dict[str, Copy] = {}
    for h in slices:
        for k, c in m.survivors(w, p, h).items():
            if k in keys and (k not in best or c.pos < best[k].pos):
                best[k] = c
    return best


def replay(m: Model, w: World, p: str, s: str, pc: int, loc: tuple) -> tuple:
    """`slicewise replay` of slice s after its pipeline's rules turned strict."""
    proto = m.proto
    if pc == 0:  # mark; what to withdraw; (shipped) refused if a holder's bronze is gone
        if not proto.verified_from_commits:
            w = m.set_rec(w, p, "mark", s, len(m.versions(w, p)) - 1)
        rows = m.rows(w, p)
        recorded = {k for (sid, k, _) in get(w.ids, p) if sid == s}
        today = m.survivors(w, p, s)
        if proto.replay_by_position:
            # The slice's stored copies that are not its survivor by today's rules, and its
            # keys with no row at all (an earlier attempt withdrew them and was cut off):
            # the same keys on every rerun until the replay rewrites `slice_ids`.
            gone = {c for c in rows if c.slice == s and c.key in recorded and today.get(c.key) != c}
            keys = {c.key for c in gone} | (recorded - {c.key for c in rows})
        else:  # the keys it recorded that it no longer holds valid (their copies elsewhere come in)
            keys = recorded - set(today)
            gone = {c for c in rows if c.slice == s and c.key in keys}
        found = holders(m, w, p, s, keys) if proto.replay_refuses_dropped else set()
        if any(m.rec(w, p, "dropped", h) for h in found):
            return w, (), "failed"  # refused before any write, the slices named
        return w, (frozenset(gone), frozenset(keys), frozenset(found)), 1
    if pc == 1:  # withdraw those copies
        gone = set(loc[0])
        if gone:
            w = m.commit(w, p, m.rows(w, p) - gone, (s, "replay"))
        return w, (loc[1], frozenset(c.date for c in gone), loc[2]), 2
    if pc == 2:  # the other slices' copies of those keys come in
        keys, changed, found = set(loc[0]), set(loc[1]), loc[2]
        # The holders read now, after the withdrawal: a slice whose MERGE saw the
        # withdrawn copy (and inserted nothing) recorded its ids before it, so it is
        # among them. Those found before the withdrawal are read from bronze as of then
        # (a drop racing the replay deletes after it); any other whose bronze was
        # dropped is skipped (a log line).
        late = {h for h in holders(m, w, p, s, keys) if h in found or not m.rec(w, p, "dropped", h)}
        for h in sorted(late):
            src = copies_of(m, w, p, {h}, keys)
            if src:
                reach = m.window({c.date for c in src.values()})
                tag = (h, "replay") if proto.verified_from_commits else (s, "replay")
                w = m.commit(w, p, m.merged_rows(m.rows(w, p), src, reach), tag)
                if proto.verified_from_commits:
                    w = w._replace(tasks=reset(w.tasks, p, h))
                changed |= reach
        return w, (frozenset(changed),), 3
    if pc == 3:  # slice_ids replaced, the MERGE by content, quarantine last
        src = m.survivors(w, p, s)
        ids = frozenset(x for x in get(w.ids, p) if x[0] != s)
        w = w._replace(ids=put(w.ids, p, ids | {(s, c.key, c.date) for c in src.values()}))
        reach = m.reach(w, p, s, set(src), {c.date for c in src.values()})
        w = m.commit(w, p, m.merged_rows(m.rows(w, p), src, reach), (s, "replay"))
        q = frozenset(c for c in get(w.quarantine, p) if c.slice != s)
        q |= {c for c in m.sc.copies if c.slice == s and not m.valid(w, p, c)}
        w = w._replace(quarantine=put(w.quarantine, p, q))
        w = m.set_rec(w, p, "replay", s, len(m.versions(w, p)) - 1)
        w = m.set_rec(w, p, "replay_changed", s, loc[0])
        w = m.set_rec(w, p, "applied", s, True)
        # the replay is a new revision: its gate, publish and announce run again
        return w._replace(tasks=reset(w.tasks, p, s)), (), "ok"
    raise AssertionError(pc)


def reset(tasks: tuple, p: str, s: str) -> tuple:
    """A slice's gate, publish and announce to run again (a new revision of it)."""
    return tuple((t, v) for t, v in tasks if not (t[:2] == (p, s) and t[2] != "ingest"))


PROGRAMS = {
    "plan": plan,
    "ingest": ingest,
    "gate": gate,
    "publish": publish,
    "announce": announce,
    "replay": replay,
}


# -- the scheduler: Airflow's task order, retries, kills and the operator ----------
def upstream_done(w: World, p: str, s: str, step: str) -> bool:
    if step in ("plan", "replay"):
        return True
    before = STEPS[STEPS.index(step) - 1]
    return (get(w.tasks, (p, s, before)) or (0, None))[1] == "ok"


def moves(m: Model, w: World) -> list[tuple[str, World]]:
    sc, out = m.sc, []
    steps = STEPS if sc.publish else STEPS[:3]
    # start an attempt of a slice's first task not yet succeeded (Airflow's task order)
    tasks = dict(w.tasks)
    live = {r[:3] for r in w.running}
    if len(w.running) < sc.parallel:
        for p in sc.pipelines:
            for s in sc.slices:
                if s in sc.skipped and f"backfill {s}" not in w.done:
                    continue  # the scheduler created no run for it
                for step in steps:
                    used, outcome = tasks.get((p, s, step), (0, None))
                    if outcome == "ok":
                        continue
                    if used < sc.attempts and (
                        (p, s, step) not in live or (sc.zombies and outcome == "lost")
                    ):
                        started = w._replace(
                            tasks=put(w.tasks, (p, s, step), (used + 1, "running")),
                            running=tuple(sorted((*w.running, (p, s, step, used + 1, 0, ())))),
                        )
                        out.append((f"start {p}/{s}/{step}#{used + 1}", started))
                    break
    # the operator: the rules turn strict, then the replay runs (once the slice is published)
    if sc.replay and "replay" not in w.done:
        p = sc.pipelines[0]
        if m.rec(w, p, "publish", sc.replay) is not None and not any(
            r[2] == "replay" for r in w.running
        ):
            # Retention drops only slices older than `bronze_retain` (days), so a slice
            # it can drop was published before the replay began, not during it.
            old = sc.drop_bronze and m.rec(w, p, "publish", sc.drop_bronze) is not None
            done = w.done | {"replay"} | ({"old enough to drop"} if old else set())
            w2 = w._replace(strict=w.strict | {p}, done=done)
            run = tuple(sorted((*w2.running, (p, sc.replay, "replay", 1, 0, ()))))
            out.append((f"rules of {p} turn strict; replay {sc.replay}", w2._replace(running=run)))
    if sc.replay and "replay" in w.done and "replay again" not in w.done:
        p = sc.pipelines[0]  # a replay cut off: the operator runs it again ("run it again")
        if m.rec(w, p, "replay", sc.replay) is None and not any(
            r[2] == "replay" for r in w.running
        ):
            w2 = w._replace(done=w.done | {"replay again"})
            run = tuple(sorted((*w2.running, (p, sc.replay, "replay", 2, 0, ()))))
            out.append((f"replay {sc.replay} again", w2._replace(running=run)))
    if sc.drop_bronze and "drop" not in w.done:
        p = sc.pipelines[0]
        published = m.rec(w, p, "publish", sc.drop_bronze) is not None
        if published and ("replay" not in w.done or "old enough to drop" in w.done):
            w2 = m.set_rec(w, p, "dropped", sc.drop_bronze, True)
            out.append(
                (
                    f"maintenance drops bronze of {sc.drop_bronze}",
                    w2._replace(done=w2.done | {"drop"}),
                )
            )
    # the operator backfills an interval `status` names as owned by no slice (the
    # refusal names it too); the protocol before it named none
    if m.proto.covers_topic:
        for s in sorted(sc.skipped):
            if f"backfill {s}" not in w.done and any(
                unowned_before(m, w, p, x) == s for p in sc.pipelines for x in m.recs(w, p, "slice")
            ):
                out.append((f"backfill {s}", w._replace(done=w.done | {f"backfill {s}"})))
    if sc.log_cleanup and "log cleanup" not in w.done:
        for p in sc.pipelines:
            latest = len(m.versions(w, p)) - 1
            if latest > floor(m, w, p) + 1:
                cleaned = w._replace(cut=put(w.cut, p, latest), done=w.done | {"log cleanup"})
                out.append((f"Delta's log cleanup keeps {p}'s silver from v{latest}", cleaned))
    if sc.group_expires and "group expired" not in w.done:
        expired = w._replace(group=tuple((p, -1) for p, _ in w.group))
        out.append(
            ("the group's offsets expire", expired._replace(done=w.done | {"group expired"}))
        )
    # step or kill a running attempt
    for i, (p, s, step, n, pc, loc) in enumerate(w.running):
        rest = w.running[:i] + w.running[i + 1 :]
        point = POINT_AFTER.get((step, pc))
        label = f"{p}/{s}/{step}#{n} {pc}" + (f" [{point}]" if point else "")
        try:
            w2, loc2, nxt = PROGRAMS[step](m, w, p, s, pc, loc)
        except Violation as v:
            out.append((label, v))
            continue
        if nxt in ("ok", "failed"):
            stale = (get(w2.tasks, (p, s, step)) or (0, None))[0] != n  # a zombie finishing
            tasks = w2.tasks if stale else put(w2.tasks, (p, s, step), (n, nxt))
            out.append((f"{label} -> {nxt}", w2._replace(running=rest, tasks=tasks)))
        else:
            run = tuple(sorted((*rest, (p, s, step, n, nxt, loc2))))
            if (nxt, loc2) == (pc, loc) and w2 == w:
                pass  # a wait that changes nothing: only another move can free it
            else:
                out.append((label, w2._replace(running=run)))
        if w.kills < sc.kills and (sc.killable is None or step in sc.killable):
            used = (get(w.tasks, (p, s, step)) or (0, None))[0]
            tasks = put(w.tasks, (p, s, step), (used, "lost")) if used == n else w.tasks
            killed = w._replace(running=rest, tasks=tasks, kills=w.kills + 1)
            out.append((f"kill {label}", killed))
            if sc.zombies and used == n:
                out.append(
                    (f"lose {label} (it runs on)", w._replace(tasks=tasks, kills=w.kills + 1))
                )
    return out


def oracle(m: Model, w: World, p: str) -> frozenset[Copy]:
    """What silver must hold: per key the lowest-positioned copy valid under the rules
    each processed slice was last written with."""
    best: dict[str, Copy] = {}
    for s in m.sc.slices:
        applied = m.rec(w, p, "applied", s)
        if applied is None:
            continue
        for c in m.sc.copies:
            if c.slice == s and not (c.strict_invalid and applied):
                if c.key not in best or c.pos < best[c.key].pos:
                    best[c.key] = c
    return frozenset(best.values())


def check_quiet(m: Model, w: World) -> None:
    for p in m.sc.pipelines:
        m.check_unique(w, p)
        rows = m.rows(w, p)
        both = rows & get(w.quarantine, p)
        if both:
            raise Violation("quarantined_and_stored", f"{p}: {sorted(both)}")
        if rows != oracle(m, w, p):
            raise Violation("not_oracle", f"{p} silver {sorted(rows)} != {sorted(oracle(m, w, p))}")


def not_seen(m: Model, w: World, p: str, s: str) -> bool:
    """The slice's gate passed, but below a commit tagged with it (`GateNotPassed`)."""
    outcome = m.rec(w, p, "gate", s)
    mine = last_commit(m, w, p, s, len(m.versions(w, p)) - 1)
    return bool(outcome and outcome[0] and mine is not None and outcome[1] < mine)


def recover(m: Model, w: World) -> None:
    """On-call's clean rerun from a quiet state: the failing expectation corrected, then
    every task not succeeded run again (no kill, one at a time, in schedule order, each
    whose upstream succeeded, until none moves), and a gate again where a publication
    says so: every slice must end published."""
    w = w._replace(repaired=True, running=(), kills=m.sc.kills)
    if m.proto.covers_topic:  # `status` names each: on-call runs it (docs/RUNBOOK.md)
        w = w._replace(done=w.done | {f"backfill {s}" for s in m.sc.skipped})
    steps = STEPS if m.sc.publish else STEPS[:3]
    pending = [
        (p, s, step)
        for p in m.sc.pipelines
        for s in m.sc.slices
        if s not in m.sc.skipped or f"backfill {s}" in w.done
        for step in steps
    ]
    moved = True
    while moved:
        moved = False
        for p, s, step in pending:
            if (get(w.tasks, (p, s, step)) or (0, None))[1] == "ok":
                continue
            if not upstream_done(w, p, s, step):
                continue
            loc, pc, w2 = (), 0, w
            for _ in range(50):
                w2, loc, pc = PROGRAMS[step](m, w2, p, s, pc, loc)
                if pc in ("ok", "failed"):
                    break
            if pc == "ok":
                w, moved = w2._replace(tasks=put(w2.tasks, (p, s, step), (9, "ok"))), True
            elif step == "publish" and not_seen(m, w, p, s):
                # GateNotPassed: its message says to run the gate again (docs/RUNBOOK.md)
                w, moved = w._replace(tasks=drop(w.tasks, (p, s, "gate"))), True
    stuck = [t for t in pending if (get(w.tasks, t) or (0, None))[1] != "ok"]
    if stuck:
        raise Violation("wedged", f"after a clean rerun of every task, {stuck} do not pass")
    for p in m.sc.pipelines:
        if gap := unowned_before(m, w, p, m.sc.slices[-1]):
            raise Violation("unowned", f"{p}: no slice owns {gap}, every task green")
    check_quiet(m, w)
    if m.sc.publish:
        check_gold_current(m, w)


def check_gold_current(m: Model, w: World) -> None:
    """Every slice published: each date of gold holds silver's rows there (a date no
    publication rebuilt holds none, like silver's)."""
    for p in m.sc.pipelines:
        dates, _ = get(w.gold, p)
        rows = m.rows(w, p)
        for d in {c.date for c in rows} | {d for d, _ in dates}:
            built = get(dates, d, (None, frozenset()))[1]
            there = frozenset(c for c in rows if c.date == d)
            if built != there:
                raise Violation(
                    "stale_gold", f"{p} gold date {d} holds {sorted(built)}, silver {sorted(there)}"
                )


@dataclass
class Report:
    scenario: str
    states: int = 0
    quiet: int = 0  # states with nothing left to run (each then rerun by on-call)
    violations: dict[str, list[str]] = field(default_factory=dict)  # invariant -> trace

    @property
    def found(self) -> set[str]:
        return set(self.violations)

    def describe(self) -> str:
        lines = [f"{self.scenario}: {self.states} states, {self.quiet} quiet"]
        for invariant, trace in sorted(self.violations.items()):
            lines.append(f"  {invariant}:")
            lines += [f"    {step}" for step in compact(trace)]
        return "\n".join(lines)


def compact(trace: list[str]) -> list[str]:
    """A trace with each attempt's consecutive actions on one line."""
    out: list[str] = []
    for step in trace:
        head = step.split(" ", 1)[0]
        if out and "#" in head and out[-1].startswith(head + " ") and "->" not in out[-1]:
            out[-1] += ", " + step.split(" ", 1)[1]
        else:
            out.append(step)
    return out


def settle(m: Model, w: World, report: Report, trace: Callable[[], list[str]]) -> None:
    """A quiet state (nothing left to run): the quiet checks, then on-call's rerun; the
    first trace to each invariant broken."""
    report.quiet += 1
    try:
        check_quiet(m, w)
        recover(m, w)
    except Violation as v:
        if v.invariant not in report.violations:
            report.violations[v.invariant] = [*trace(), str(v)]


def explore(sc: Scenario, proto: Protocol = SHIPPED, limit: int = 2_000_000) -> Report:
    """Every state the scenario can reach (depth first, each once); the first trace to
    each invariant it breaks."""
    m, report = Model(sc, proto), Report(sc.name)
    start = initial(sc)
    seen = {start}
    # Each state on the stack points at the move that reached it: (label, the move
    # before it), so a trace is built only for a violation, not copied at every step.
    stack: list[tuple[World, tuple | None]] = [(start, None)]

    def trace_of(path: tuple | None) -> list[str]:
        labels = []
        while path is not None:
            label, path = path
            labels.append(label)
        return labels[::-1]

    while stack:
        w, path = stack.pop()
        report.states += 1
        if report.states > limit:
            raise RuntimeError(f"{sc.name}: more than {limit} states; bound the scenario")
        nexts = moves(m, w)
        if not nexts:
            settle(m, w, report, partial(trace_of, path))
            continue
        for label, w2 in nexts:
            if isinstance(w2, Violation):
                if w2.invariant not in report.violations:
                    report.violations[w2.invariant] = [*trace_of(path), label, str(w2)]
            else:
                known = len(seen)
                seen.add(w2)  # one hash of the state, where `in` then `add` took two
                if len(seen) > known:
                    stack.append((w2, (label, path)))
    return report


def walk(sc: Scenario, proto: Protocol = SHIPPED, seed: int = 0, walks: int = 200) -> Report:
    """Seeded random walks of the same model, for scenarios too big to search whole
    (retries=3 with four runs in flight): from the start, one move drawn at random in
    each state until nothing is left to run, then the quiet checks and on-call's rerun;
    `walks` times. The first trace to each invariant broken, as `explore` reports."""
    rng = random.Random(seed)
    m, report = Model(sc, proto), Report(f"{sc.name} ({walks} walks, seed {seed})")
    for _ in range(walks):
        w, trace = initial(sc), []
        while True:
            report.states += 1
            nexts = moves(m, w)
            if not nexts:
                settle(m, w, report, trace.copy)
                break
            label, w2 = rng.choice(nexts)
            if isinstance(w2, Violation):
                report.violations.setdefault(w2.invariant, [*trace, label, str(w2)])
                break
            trace.append(label)
            w = w2
    return report


def shipped(**fixes: bool) -> Protocol:
    return replace(SHIPPED, **fixes)
