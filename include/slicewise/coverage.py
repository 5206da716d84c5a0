"""Coverage: from a pipeline's origin on, every offset belongs to a slice.

A run owns the slice of its interval, and only Airflow decides which intervals get a
run: with catchup off, after a scheduler outage or a paused DAG, it creates the run
for the latest interval alone, and nothing else plans the ones it skipped. Their
records would be in no slice, never read, while every task is green and the group
commits past them. So what publication depends on is checked where it publishes.

Slices share boundaries, so in start order they cover the topic from the origin to a
time T exactly when each starts at or before the end of the ones before it, up to T;
the first place that fails is an unowned range `[end, next start)`. The origin is
recorded when the pipeline's first slice is planned (`marks/covered.json`, never
moved): the definition's `start` if it declares one (so a first interval whose run
failed is still named), else that slice's start. A run planned before the origin
later is a backfill of the history before the pipeline and owns its interval only.
A ledger from before the marks starts at its oldest slice not yet published.

Walks are bounded by marks the ledger keeps and only raises: `covered` (the end of the
covered run from the origin) and `acknowledged` (the end of the run of published
slices from the origin, the boundary the consumer group was last given). A walk reads
the slices planned since its mark: those in flight, and those planned past a gap
until it is repaired.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from slicewise.errors import OperationalError
from slicewise.ledger import Ledger, SliceNotPlanned
from slicewise.slices import Slice, stamp

SEED = 1_000  # a ledger from before the marks: its latest slices, read once


@dataclass(frozen=True)
class Unowned:
    """Offsets between two boundaries that no slice owns."""

    start: datetime
    end: datetime  # the next slice's start

    def describe(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"


def run_from(
    through: datetime,
    following: Iterable[Slice],
    until: datetime | None = None,
    counts: Callable[[Slice], bool] = lambda _: True,
) -> tuple[datetime, Slice | None, Unowned | None]:
    """Follow `following` (the slices starting at or after `through`, in start order)
    while each starts at or before the run's end and `counts`, up to `until` (None: as
    far as they go). Returns the run's end, its last slice, and the unowned range that
    stopped it (None: `until` reached, a slice that does not count, or no slice
    planned past)."""
    last = None
    for sl in following:
        if until is not None and through >= until:
            break
        if sl.end <= through:
            continue  # a backfill before the origin, or inside the run already
        if sl.start > through:
            end = sl.start if until is None else min(sl.start, until)
            return through, last, Unowned(through, end)
        if not counts(sl):
            break
        # An interval not on the schedule may overlap the run's last one: it still
        # owns what lies past its end.
        through, last = sl.end, sl
    else:
        if until is not None and through < until:
            return through, last, Unowned(through, until)
    return through, last, None


def note_origin(ledger: Ledger, declared: datetime | None) -> None:
    """Record where coverage starts, once, when a slice is planned: `declared` (the
    definition's `start`), else the first slice's start. A ledger from before the marks
    (more slices than this one) is seeded where a walk first needs it (`origin`), so
    planning reads the same whatever the history."""
    if ledger.mark("covered") is not None:
        return
    if declared is None:
        latest = ledger.latest_slices(2)
        if len(latest) != 1:
            return
        declared = latest[0].start
    at = declared.isoformat()
    ledger.create_mark("covered", {"origin": at, "through": at})


def _seed(ledger: Ledger) -> None:
    """A ledger from before the marks, once: its oldest slice not yet published among its
    latest `SEED`, so the walks start below any slice still waiting."""
    latest = ledger.latest_slices(SEED)
    if not latest:
        return
    waiting = (sl for sl in latest if ledger.step(sl.slice_id, "publish") is None)
    at = next((sl.start for sl in waiting), latest[-1].end).isoformat()
    ledger.create_mark("covered", {"origin": at, "through": at})


def origin(ledger: Ledger) -> datetime | None:
    """Where the pipeline's coverage starts (None: no slice planned yet)."""
    mark = ledger.mark("covered")
    if mark is None:  # a ledger from before the marks
        _seed(ledger)
        mark = ledger.mark("covered")
    return None if mark is None else datetime.fromisoformat(mark["origin"])


def through(ledger: Ledger, name: str) -> datetime | None:
    """Where the run a mark follows from the origin ends, as far as the mark knows (the
    origin without it; None: no slice planned yet)."""
    start = origin(ledger)
    mark = ledger.mark(name)
    if start is None or mark is None:
        return start
    return max(start, datetime.fromisoformat(mark["through"]))


def acknowledged_through(ledger: Ledger) -> datetime | None:
    """Where the run of published slices from the origin ends, as far as the
    `acknowledged` mark knows: every slice before it is published."""
    return through(ledger, "acknowledged")


def first_unowned(ledger: Ledger, before: datetime | None = None) -> Unowned | None:
    """The first range no slice owns between the origin and `before` (None: up to the
    newest slice), raising the `covered` mark to where the walk got."""
    covered = through(ledger, "covered")
    if covered is None:
        return None
    if before is not None and covered >= before:
        return None
    end, _, gap = run_from(covered, ledger.latest_slices(1 << 62, since=covered), before)
    if end > covered:
        ledger.raise_mark("covered", "through", end)
    return gap


def unowned_ranges(ledger: Ledger) -> list[Unowned]:
    """Every range no slice owns between the origin and the newest slice (`status`)."""
    first = first_unowned(ledger)
    if first is None:
        return []
    gaps, through = [first], first.end
    following = ledger.latest_slices(1 << 62, since=through)
    while (gap := run_from(through, following)[2]) is not None:
        gaps.append(gap)
        through = gap.end
    return gaps


def planned_at(ledger: Ledger, at: datetime) -> bool:
    """Whether a slice starting at `at` and ending at the next stored boundary (a run of
    the schedule's) is planned: two reads, where a walk reads every slice since."""
    after = ledger.after(at)
    if after is None:
        return False
    try:
        ledger.load_slice(f"{stamp(at)}-{stamp(after.at)}")
    except SliceNotPlanned:
        return False
    return True


class UnownedRange(OperationalError):
    """Offsets below a slice belong to no slice: publishing it would pass them."""

    def __init__(self, slice_id: str, gap: Unowned, topic: str, dag_id: str) -> None:
        self.gap = gap
        start, end = gap.start.isoformat(), gap.end.isoformat()
        super().__init__(
            f"slice {slice_id} was NOT published: no slice owns topic {topic}'s offsets in "
            f"{gap.describe()}, so nothing read them; publishing past them would pass records "
            "that are in no table (the scheduler skipped those intervals: an outage, a "
            "paused DAG, catchup off, or a run that never planned). Nothing downstream "
            "changed. Run those intervals, then clear this task: `airflow backfill create "
            f"--dag-id {dag_id} --from-date {start} --to-date {end} --max-active-runs 4` (the "
            "runs plan at once: a slice committed after the range waits for all of it), or by "
            f"hand `slicewise plan --start {start} --end {end}` and its steps "
            "(docs/RUNBOOK.md#unowned-range)."
        )


def require_owned(
    ledger: Ledger, sl: Slice, wait_seconds: float, dag_id: str, sleep: float = 2.0
) -> None:
    """Return once every offset from the origin up to `sl` belongs to a slice; a range
    not yet owned is waited for up to `wait_seconds` (runs plan out of order: the one
    before may be planning), then refused (`UnownedRange`). While it waits, only the
    range's first interval is looked for; the whole walk runs again once it is there,
    and once more before refusing."""
    deadline = time.monotonic() + wait_seconds
    while (gap := first_unowned(ledger, sl.start)) is not None:
        while not planned_at(ledger, gap.start):
            if time.monotonic() > deadline:
                if (gap := first_unowned(ledger, sl.start)) is None:
                    return
                raise UnownedRange(sl.slice_id, gap, ledger.topic, dag_id)
            time.sleep(sleep)
