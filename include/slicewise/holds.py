"""Partitions whose last stable offset an undecided transaction holds back.

Nothing is read past the LSO (read_committed), which is right; but a transaction
that neither commits nor aborts holds it for as long as it lasts, and every slice
stops short of it. Each plan compares the LSO with the high watermark: behind it
means records past the LSO await a decision. A hold is dated from the first plan
that saw the LSO at that offset, so its age is known to within one interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Hold:
    partition: int
    offset: int  # the LSO: the first offset of the oldest undecided transaction
    waiting: int  # records past it, up to the high watermark
    since: datetime  # the first plan that saw the LSO held at this offset

    def age(self, now: datetime) -> timedelta:
        return now - self.since

    def describe(self, now: datetime) -> str:
        minutes = self.age(now).total_seconds() / 60
        return (
            f"partition {self.partition}: last stable offset held at {self.offset} by an open "
            f"transaction since {self.since.isoformat()} ({minutes:.0f} min), "
            f"{self.waiting} records waiting past it"
        )


def track(
    previous: Mapping[int, Hold],
    lso: Mapping[int, int],
    high: Mapping[int, int],
    now: datetime,
) -> dict[int, Hold]:
    """The holds now: a partition is held where its LSO is behind its high watermark;
    a hold keeps its `since` while the LSO stays at the same offset."""
    holds = {}
    for p, offset in lso.items():
        if high.get(p, offset) > offset:
            before = previous.get(p)
            since = before.since if before is not None and before.offset == offset else now
            holds[p] = Hold(p, offset, high[p] - offset, since)
    return holds


def overdue(holds: Mapping[int, Hold], now: datetime, limit: timedelta | None) -> list[Hold]:
    """Holds older than `limit` (None: no limit)."""
    if limit is None:
        return []
    return [h for h in holds.values() if h.age(now) > limit]
