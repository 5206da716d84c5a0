"""The slice model, as pure functions: boundaries, slices, contiguity, data loss.

A boundary B(t) maps each partition to the first offset at or after time t,
capped at the last stable offset (LSO) when it was resolved. The run for the
interval [t0, t1) owns the slice [B(t0), B(t1)). A partition absent from a
boundary did not exist when it was resolved, so its offsets begin at 0 there.

Each boundary also records which log its offsets count in: the topic's id (KIP-516)
and the ledger's epoch. A topic deleted and recreated (a new id), or one whose offsets
went backwards (an unclean leader election, a restore), starts a new epoch once an
operator accepts it (`plan --accept-topic-reset`); a slice whose boundaries lie in two
epochs reads the new log from its start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from slicewise.errors import OperationalError

Offsets = Mapping[int, int]


def utc(ts: datetime) -> datetime:
    """Normalise to a plain, aware UTC datetime; naive input is rejected, not guessed.

    Subclasses (pendulum's, from Airflow) are converted to `datetime` itself:
    pendulum drops the zone when a timedelta is added to a timezone.utc value.
    """
    if ts.tzinfo is None:
        raise ValueError(f"{ts!r} has no time zone; slice times must be timezone-aware (UTC).")
    t = ts.astimezone(timezone.utc)
    return datetime(
        t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, tzinfo=timezone.utc
    )


def stamp(ts: datetime) -> str:
    """Compact, sortable UTC stamp used in slice ids and ledger file names."""
    return utc(ts).strftime("%Y%m%dT%H%M%SZ")


def from_stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)


def slice_interval(slice_id: str) -> tuple[datetime, datetime]:
    """A slice id's [start, end)."""
    start, end = slice_id.split("-")
    return from_stamp(start), from_stamp(end)


@dataclass(frozen=True)
class Boundary:
    topic: str
    at: datetime
    offsets: Mapping[int, int]
    resolved_at: datetime | None = None
    topic_id: str | None = None  # None: resolved before slicewise recorded topic ids
    epoch: int = 0
    # Per partition, the last record below the offset and the leader epoch it was written
    # in (KIP-320): the same position holding another epoch later means the log there
    # was truncated and refilled. Empty: resolved before slicewise recorded them.
    below: Mapping[int, tuple[int, int]] = field(default_factory=dict)

    def offset(self, partition: int) -> int:
        return self.offsets.get(partition, 0)


@dataclass(frozen=True)
class Slice:
    """For every partition, the half-open offset range [start, end)."""

    topic: str
    start: datetime
    end: datetime
    ranges: Mapping[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def slice_id(self) -> str:
        return f"{stamp(self.start)}-{stamp(self.end)}"

    @property
    def record_count_upper_bound(self) -> int:
        """Offsets owned; transaction markers and aborted records make the real count lower."""
        return sum(until - frm for frm, until in self.ranges.values())

    def describe(self) -> str:
        parts = ", ".join(f"p{p}=[{a},{b})" for p, (a, b) in sorted(self.ranges.items()))
        return f"slice {self.slice_id} of {self.topic}: {parts or 'no partitions'}"


class ContiguityError(OperationalError):
    """Stored boundaries would make a slice overlap or skip offsets."""


class TopicReset(OperationalError):
    """The topic's offsets no longer count in the log the ledger's boundaries were
    resolved in: it was deleted and recreated (a new topic id), or a partition's log
    ends below a stored boundary (an unclean leader election, a restore). Reading on
    would skip the new log's first records, or read them as the old slice's."""


def offsets_went_back(stored: Boundary, topic_id: str | None, lso: Offsets) -> list[str]:
    """How the topic now contradicts a boundary resolved in the current epoch: a new topic
    id, or partitions whose LSO lies below the stored offset (an LSO never decreases)."""
    found = []
    if stored.topic_id is not None and topic_id is not None and stored.topic_id != topic_id:
        found.append(f"the topic's id is {topic_id}, it was {stored.topic_id}")
    for p, o in sorted(stored.offsets.items()):
        if p not in lso and o > 0:
            found.append(f"partition {p} no longer exists (the stored offset is {o})")
        elif p in lso and lso[p] < o:
            found.append(f"partition {p} ends at {lso[p]}, below the stored {o}")
    return found


def rewritten_below(
    stored: Boundary, now: Mapping[int, tuple[int, int] | None], log_start: Offsets
) -> list[str]:
    """How the log below a stored boundary was rewritten: a partition whose last record
    below the offset is now another one (another position, or the same position written
    in another leader epoch), as after an unclean leader election whose new leader's
    log was refilled past the boundary. A record that retention deleted since (below
    the log start) proves nothing; truncation not refilled yet is `offsets_went_back`'s."""
    found = []
    for p, (offset, leader_epoch) in sorted(stored.below.items()):
        current = now.get(p)
        if current is None or offset < log_start.get(p, 0) or current == (offset, leader_epoch):
            continue
        found.append(
            f"partition {p}: the last record below the stored {stored.offset(p)} was offset "
            f"{offset} of leader epoch {leader_epoch}, it is now offset {current[0]} of leader "
            f"epoch {current[1]} (the log was truncated and written again)"
        )
    return found


@dataclass(frozen=True)
class DataLoss:
    partition: int
    missing_from: int
    missing_until: int

    @property
    def count(self) -> int:
        return self.missing_until - self.missing_from


class DataLossError(OperationalError):
    """Kafka no longer retains offsets a slice owns, or may have owned."""

    def __init__(self, headline: str, losses: list[DataLoss], step: str):
        self.losses = losses
        lines = [
            f"DATA LOSS {headline}",
            *(
                f"  partition {d.partition}: offsets [{d.missing_from}, {d.missing_until}) are gone ({d.count} offsets)"
                for d in losses
            ),
            f"  total: {sum(d.count for d in losses)} offsets across {len(losses)} partition(s).",
            "Safe next step: if the records can be recovered (re-produce them), do that; otherwise "
            "rerun with the data-loss override (DAG param accept_data_loss=true, or "
            f"`slicewise {step} ... --accept-data-loss`) to go on with what remains. The override "
            "is logged and recorded in the ledger.",
        ]
        super().__init__("\n".join(lines))

    @classmethod
    def in_slice(cls, sl: Slice, losses: list[DataLoss]) -> DataLossError:
        """Retention deleted offsets of a frozen slice before it was ingested."""
        return cls(
            f"in {sl.describe()}: Kafka no longer retains offsets this slice owns.",
            losses,
            "bronze",
        )

    @classmethod
    def before_planning(
        cls, topic: str, start: datetime, end: datetime, losses: list[DataLoss]
    ) -> DataLossError:
        """Retention deleted offsets that may belong to an interval never planned before."""
        return cls(
            f"before the interval [{start.isoformat()}, {end.isoformat()}) of {topic} was "
            "planned: retention deleted records since the previous boundary, and the earliest "
            "record Kafka still retains is from after the interval's start, so some of the "
            "deleted ones may have been this interval's. Nothing was frozen.",
            losses,
            "plan",
        )


def resolve_offset(at_time: int | None, lso: int, floor: int, ceiling: int | None) -> int:
    """One partition's boundary offset.

    Args:
        at_time: first offset with timestamp >= t, or None when no record has one yet.
        lso: the partition's last stable offset now (read_committed end).
        floor: the nearest earlier stored boundary's offset (0 if none).
        ceiling: the nearest later stored boundary's offset, if any.

    Returns:
        The offset, capped at the LSO so no undecided transaction is cut, and kept
        between its neighbours so slices stay contiguous whatever the resolution order.
    """
    offset = lso if at_time is None else min(at_time, lso)
    offset = max(offset, floor)
    if ceiling is not None:
        offset = min(offset, ceiling)
    return offset


def slice_between(lower: Boundary, upper: Boundary) -> Slice:
    """The slice [lower, upper); raises if the boundaries go backwards. Across an accepted
    topic reset (the upper boundary in a later epoch) the slice reads the new log from
    its start: the lower boundary's offsets counted in a log that is gone."""
    if not utc(lower.at) < utc(upper.at):
        raise ContiguityError(f"boundary {lower.at} is not before {upper.at}")
    reset = upper.epoch > lower.epoch
    ranges: dict[int, tuple[int, int]] = {}
    for partition in sorted(set(lower.offsets) | set(upper.offsets)):
        frm, until = 0 if reset else lower.offset(partition), upper.offset(partition)
        if until < frm:
            raise ContiguityError(
                f"partition {partition}: boundary at {lower.at} is {frm} but the later one at "
                f"{upper.at} is {until}; stored boundaries must never decrease. Inspect the ledger "
                "with `slicewise status` before changing anything."
            )
        ranges[partition] = (frm, until)
    return Slice(lower.topic, lower.at, upper.at, ranges)


def check_contiguous(boundaries: list[Boundary]) -> None:
    """Every consecutive pair of stored boundaries must form a valid slice."""
    ordered = sorted(boundaries, key=lambda b: b.at)
    for lower, upper in zip(ordered, ordered[1:], strict=False):
        slice_between(lower, upper)


def find_data_loss(sl: Slice, earliest: Offsets) -> list[DataLoss]:
    """Ranges of the slice below the earliest offset Kafka still retains."""
    losses = []
    for partition, (frm, until) in sorted(sl.ranges.items()):
        retained = earliest.get(partition, 0)
        if frm < retained and frm < until:
            losses.append(DataLoss(partition, frm, min(retained, until)))
    return losses


def find_loss_before_planning(
    floor: Offsets, earliest: Offsets, first_at_or_after_start: Mapping[int, int | None]
) -> list[DataLoss]:
    """Offsets retention deleted where they may have belonged to an interval whose lower
    boundary is about to be resolved for the first time.

    A partition lost some when its log start is above the previous boundary (`floor`,
    0 if none) and its earliest retained record is at or after the interval's start
    (Kafka's by-time lookup for the start lands on it): then the deleted records just
    before it may fall in the interval. A partition with no record left cannot be dated
    and is not reported.
    """
    losses = []
    for partition, retained in sorted(earliest.items()):
        previous = floor.get(partition, 0)
        if retained > previous and first_at_or_after_start.get(partition) == retained:
            losses.append(DataLoss(partition, previous, retained))
    return losses
