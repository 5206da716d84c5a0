"""Coverage: from a pipeline's origin on, every offset belongs to a slice.

A run owns the slice of its interval, and only Airflow decides which intervals get a
run: with catchup off, after a scheduler outage or a paused DAG, it creates the run
for the latest interval alone, and nothing else plans the ones it skipped. Their
records would be in no slice, never read, while every task is green and the group
commits past them. So what publication depends on is checked where it publishes.

Slices share boundaries, so in start order they cover the topic from the origin to a
time T exactly when each starts where the one before it ends, up to T; the first
place that fails is an unowned range `[end, next start)`. The origin is the first
slice the ledger held when coverage was first walked (`marks/covered.json`, never
moved): a run planned before it later is a backfill of the history that precedes
the pipeline, and owns its own interval only.

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
from slicewise.ledger import Ledger
from slicewise.slices import Slice

SEED = 1_000  # a ledger from before the marks: its origin is the oldest of its latest slices


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
    while each starts where the run ends and `counts`, up to `until` (None: as far as
    they go). Returns the run's end, its last slice, and the unowned range that stopped
    it (None: `until` reached, a slice that does not count, or no slice planned past)."""
    last = None
    for sl in following:
        if until is not None and through >= until:
            break
        if sl.start < through:
            continue  # a backfill before the origin, or a slice the run already passed
        if sl.start > through:
            return (
                through,
                last,
                Unowned(through, sl.start if until is None else min(sl.start, until)),
            )
        if not counts(sl):
            break
        through, last = sl.end, sl
    else:
        if until is not None and through < until:
            return through, last, Unowned(through, until)
    return through, last, None


def origin(ledger: Ledger) -> datetime | None:
    """Where the pipeline's coverage starts (None: no slice planned yet). Fixed by the
    first walk: the oldest slice then held, or for a ledger from before the marks the
    oldest of its latest `SEED` slices."""
    mark = ledger.mark("covered")
    if mark is not None:
        return datetime.fromisoformat(mark["origin"])
    seed = ledger.latest_slices(SEED)
    if not seed:
        return None
    first = seed[0].start
    ledger.create_mark("covered", {"origin": first.isoformat(), "through": first.isoformat()})
    return datetime.fromisoformat(ledger.mark("covered")["origin"])


def first_unowned(ledger: Ledger, before: datetime | None = None) -> Unowned | None:
    """The first range no slice owns between the origin and `before` (None: up to the
    newest slice), raising the `covered` mark to where the walk got."""
    start = origin(ledger)
    if start is None:
        return None
    mark = ledger.mark("covered") or {}
    through = max(start, datetime.fromisoformat(mark.get("through", start.isoformat())))
    if before is not None and through >= before:
        return None
    end, _, gap = run_from(through, ledger.latest_slices(1 << 62, since=through), before)
    if end > through:
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
            f"--dag-id {dag_id} --from-date {start} --to-date {end}`, or by hand `slicewise "
            f"plan --start {start} --end {end}` and its steps (docs/RUNBOOK.md#unowned-range)."
        )


def require_owned(
    ledger: Ledger, sl: Slice, wait_seconds: float, dag_id: str, sleep: float = 2.0
) -> None:
    """Return once every offset from the origin up to `sl` belongs to a slice; a range
    not yet owned is waited for up to `wait_seconds` (runs plan out of order: the one
    before may be planning), then refused (`UnownedRange`)."""
    deadline = time.monotonic() + wait_seconds
    while (gap := first_unowned(ledger, sl.start)) is not None:
        if time.monotonic() > deadline:
            raise UnownedRange(sl.slice_id, gap, ledger.topic, dag_id)
        time.sleep(sleep)
