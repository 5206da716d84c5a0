"""Plan a run's slice: resolve (once) and store the boundaries of its interval."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from slicewise.config import Settings
from slicewise.coverage import note_origin
from slicewise.errors import OperationalError
from slicewise.faults import fault_point
from slicewise.holds import overdue, track
from slicewise.kafka.offsets import TopicOffsets
from slicewise.lease import PlanningLease
from slicewise.ledger import Ledger
from slicewise.slices import (
    Boundary,
    DataLoss,
    DataLossError,
    Slice,
    TopicReset,
    check_contiguous,
    find_loss_before_planning,
    offsets_went_back,
    resolve_offset,
    rewritten_below,
    slice_between,
    utc,
)

log = logging.getLogger(__name__)


class StuckTransaction(OperationalError):
    """An open transaction has held a partition's LSO for longer than allowed."""


class CompactedTopic(OperationalError):
    """The topic is compacted and the definition does not say what its tombstones are."""


class IntervalNotClosed(OperationalError):
    """The interval (plus grace) has not ended; its end boundary cannot be frozen yet."""


def resolve_boundary(
    ledger: Ledger,
    offsets: TopicOffsets,
    at: datetime,
    accept_reset: bool = False,
    lease: PlanningLease | None = None,
) -> Boundary:
    """Return the stored boundary for `at`, resolving and storing it (under the planning
    `lease`) if it is new."""
    stored = ledger.boundary(at)
    if stored is not None:
        return stored
    before, after = ledger.neighbours(at)
    by_time, lso = offsets.snapshot(at)
    topic_id = offsets.topic_id()

    def rewritten(n: Boundary) -> list[str]:  # KIP-320: the records below it, read again
        if not n.below:
            return []
        now = offsets.last_records_below({p: n.offset(p) for p in n.below})
        return rewritten_below(n, now, offsets.earliest(sorted(n.below)))

    epoch = log_epoch(ledger, at, before, after, topic_id, lso, accept_reset, rewritten)
    resolved = {
        p: resolve_offset(
            by_time.get(p),
            lso[p],
            floor=before.offset(p) if before and before.epoch == epoch else 0,
            # A partition absent from the later boundary did not exist when it was
            # resolved: its offsets begin there at 0, so this boundary's must too.
            ceiling=after.offset(p) if after else None,
        )
        for p in lso
    }
    below = {p: r for p, r in offsets.last_records_below(resolved).items() if r is not None}
    now = datetime.now(timezone.utc)
    boundary = Boundary(ledger.topic, at, resolved, now, topic_id, epoch, below)
    winner = ledger.put_boundary(boundary, lease)
    log.info("boundary %s: %s (LSO %s)", at.isoformat(), dict(winner.offsets), dict(lso))
    return winner


def log_epoch(
    ledger: Ledger,
    at: datetime,
    before: Boundary | None,
    after: Boundary | None,
    topic_id: str | None,
    lso: dict[int, int],
    accept_reset: bool,
    rewritten: Callable[[Boundary], list[str]] = lambda _: [],
) -> int:
    """The epoch a new boundary at `at` is resolved in: the ledger's current one, unless
    the topic contradicts the neighbours resolved in it (a new topic id, an LSO below a
    stored offset, the log below one `rewritten`). Then planning stops, naming what changed, until an operator accepts
    the reset; the acceptance starts the next epoch, recorded in the ledger, whose
    boundaries count from the new log's start."""
    epoch = ledger.current_epoch()
    if after is not None and after.epoch < epoch:
        raise TopicReset(
            f"topic {ledger.topic}: the interval at {at.isoformat()} lies before the topic "
            f"reset accepted as epoch {epoch} (docs/RUNBOOK.md#topic-reset): its records were in "
            "the old log, which is gone. Nothing was frozen; plan intervals after the reset."
        )
    changes = [
        change
        for n in (before, after)
        if n is not None and n.epoch == epoch
        for change in offsets_went_back(n, topic_id, lso) or rewritten(n)
    ]
    if not changes:
        return epoch
    if not accept_reset:
        raise TopicReset(
            f"topic {ledger.topic} went backwards since the ledger's boundaries around "
            f"{at.isoformat()} were resolved: {'; '.join(changes)}. It was deleted and "
            "recreated, restored, or lost records in an unclean leader election; reading on "
            "would skip the new log's records or read them as old slices'. Nothing was frozen. "
            "Safe next step: find out what happened to the topic; records already in silver "
            "stay there. To read the topic as it is now from its start, rerun planning with "
            "the reset override (DAG param accept_topic_reset=true, or `slicewise plan ... "
            "--accept-topic-reset`); it is recorded in the ledger (docs/RUNBOOK.md#topic-reset)."
        )
    started = ledger.start_epoch(
        epoch + 1, {"topic_id": topic_id, "changes": changes, "found_at": at.isoformat()}
    )
    log.warning("TOPIC RESET ACCEPTED by override (epoch %s): %s", started["epoch"], changes)
    return int(started["epoch"])


def watch_holds(settings: Settings, ledger: Ledger, offsets: TopicOffsets, now: datetime) -> None:
    """Report each partition an open transaction holds back; fail once one is overdue.

    Nothing is lost either way: the slice stops short of the LSO and later slices
    take the rest once the transaction ends. Failing makes a transaction that never
    ends (a hanging one, a producer that died without aborting and a broker timeout
    above our limit) a red task instead of slices that quietly stop short.
    """
    partitions = offsets.partitions()
    holds = track(
        ledger.holds(), offsets.last_stable(partitions), offsets.high_watermarks(partitions), now
    )
    ledger.save_holds(holds)
    for hold in holds.values():
        log.warning("%s; nothing past it is read until it ends", hold.describe(now))
    limit = settings.max_open_transaction_seconds
    if late := overdue(holds, now, timedelta(seconds=limit) if limit else None):
        raise StuckTransaction(
            f"topic {settings.topic}: "
            + "; ".join(h.describe(now) for h in late)
            + f". That is over SLICEWISE_MAX_OPEN_TRANSACTION_SECONDS={limit}: this interval "
            "cannot be frozen past it, and nothing was written. Find the transaction's producer "
            "and let it end, or abort it (kafka-transactions.sh find-hanging / abort); then "
            "clear this task. See docs/RUNBOOK.md#stuck-lso."
        )


def retention_losses(
    ledger: Ledger, offsets: TopicOffsets, start: datetime, end: datetime, accept: bool
) -> list[DataLoss]:
    """Offsets retention deleted that may belong to [start, end), whose lower boundary is
    new (a first run, or a backfill of an interval never planned). A slice frozen earlier
    is covered by bronze's own check; this covers what was gone before any slice owned it.
    Raises the data-loss report unless `accept`."""
    before = ledger.before(start)
    partitions = offsets.partitions()
    losses = find_loss_before_planning(
        {p: before.offset(p) for p in partitions} if before else {},
        offsets.earliest(partitions),
        offsets.for_time(start, partitions),
    )
    if losses:
        error = DataLossError.before_planning(ledger.topic, start, end, losses)
        if not accept:
            raise error
        log.warning("DATA LOSS ACCEPTED by override:\n%s", error)
    return losses


def refuse_compacted(settings: Settings, offsets: TopicOffsets) -> None:
    """A compacted topic is read as it stands when a slice is ingested: Kafka may have
    removed a key's earlier records and left tombstones (null values) for deleted keys,
    so it is read only when the definition says what tombstones are."""
    policy = offsets.cleanup_policy()
    if policy is None:
        log.warning(
            "topic %s: this principal may not describe the topic's configuration, so "
            "planning cannot tell whether it is compacted (grant DESCRIBE_CONFIGS to check)",
            settings.topic,
        )
        return
    if "compact" in policy and settings.pipeline.tombstones is None:
        raise CompactedTopic(
            f"topic {settings.topic} has cleanup.policy={policy}: Kafka removes records a "
            "later one with the same key supersedes, and a deleted key leaves a tombstone "
            "(a record without a value). slicewise reads what is left when a slice is "
            "ingested, so superseded records may never be read. Nothing was frozen. If that "
            f"is what you want, set `tombstones: quarantine` in pipeline "
            f"{settings.pipeline.name!r}'s definition (each tombstone is quarantined as "
            "null_value); otherwise read a topic with cleanup.policy=delete "
            "(docs/PIPELINES.md#compacted-topics)."
        )


def plan_slice(
    settings: Settings,
    start: datetime,
    end: datetime,
    now: datetime | None = None,
    accept_data_loss: bool = False,
    accept_topic_reset: bool = False,
) -> Slice:
    """Freeze and return the slice owned by the interval [start, end).

    Reruns, cleared tasks and backfills get the stored slice back unchanged.
    """
    start, end = utc(start), utc(end)
    now = utc(now) if now else datetime.now(timezone.utc)
    ledger = Ledger.of(settings)
    closes = end + timedelta(seconds=settings.grace_seconds)
    frozen = ledger.boundary(end) is not None  # a rerun of a frozen slice
    if not frozen and now < closes:
        raise IntervalNotClosed(
            f"interval [{start.isoformat()}, {end.isoformat()}) closes at {closes.isoformat()} "
            f"(end + {settings.grace_seconds}s grace); it is {now.isoformat()}. The DAG waits for "
            "this; by hand, retry after that time."
        )
    offsets = TopicOffsets.of(settings)
    if not frozen:
        watch_holds(settings, ledger, offsets, now)
    losses = []
    if ledger.boundary(start) is None:
        losses = retention_losses(ledger, offsets, start, end, accept_data_loss)
    lower, upper = ledger.boundary(start), ledger.boundary(end)
    if lower is None or upper is None:
        refuse_compacted(settings, offsets)
        with ledger.planning() as lease:  # new boundaries: one planner at a time
            lower = resolve_boundary(ledger, offsets, start, accept_topic_reset, lease)
            upper = resolve_boundary(ledger, offsets, end, accept_topic_reset, lease)
    # Neighbouring boundaries must form valid slices; only the pairs around the two
    # just resolved can have changed, so only their neighbours are read, not the history.
    for b in (lower, upper):
        before, after = ledger.neighbours(b.at)
        check_contiguous([x for x in (before, b, after) if x is not None])
    sl = slice_between(lower, upper)
    fault_point("plan.resolved", settings, sl.slice_id)
    ledger.save_slice(sl)
    note_origin(ledger, settings.pipeline.start)  # the first slice: where coverage starts
    if losses:
        ack = {"losses": [d.__dict__ for d in losses], "found_by": "plan"}
        ledger.record_step(sl.slice_id, "data_loss_ack", ack)
    if upper.epoch > lower.epoch:
        reset = next(e for e in ledger.epochs() if e["epoch"] == upper.epoch)
        ledger.record_step(sl.slice_id, "topic_reset_ack", reset)
    ledger.record_step(
        sl.slice_id, "plan", {"ranges": {str(p): list(r) for p, r in sl.ranges.items()}}
    )
    return sl
