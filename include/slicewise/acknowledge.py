"""Acknowledge: after a slice is published, its upper boundary becomes the committed
offsets of the pipeline's Kafka consumer group, so the lag tools users already run see
the pipeline: processing is complete once the gate proved the slice and publish ran.

The ledger stays the source of truth; nothing reads the group to plan. The group only
moves forward, and never past a slice not yet published: from the slice it holds (its
commits' metadata) to the end of the run of published slices that follows, so a later
hour published before an earlier one leaves it below the earlier one. A backfill of an
older hour, or a rerun of an older slice, leaves it where it is. Kafka
has no compare-and-set for a group's offsets, so two publications at once could both
find the group behind them and the older one commit last. Each publication is recorded
in the ledger before its commit, and after committing each looks for a newer published
slice and commits that one instead: the last commit to land carries the newest
publication recorded before it.

A commit that fails (no ACL, the broker away, a consumer in the group) is a warning
in the task log and in `slicewise status`, never a failed publication; the next
publication moves the group past it.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from slicewise.config import Settings
from slicewise.kafka.consumer_group import ConsumerGroup
from slicewise.kafka.offsets import client_conf
from slicewise.ledger import PAGE, Ledger, SliceNotPlanned
from slicewise.slices import Slice

log = logging.getLogger(__name__)
RUNBOOK = "docs/RUNBOOK.md#the-consumer-group-was-not-moved"
FOLLOWING = 100_000  # slices read after the group's: as many as were planned since it


def acknowledge(settings: Settings, ledger: Ledger, published: Slice) -> dict[str, Any] | None:
    """Move the group to the newest published slice's upper boundary if it is behind
    it; record the outcome as the slice's `acknowledge` step. None when turned off."""
    name = settings.pipeline.consumer_group_name
    if name is None:
        return None
    try:
        with ConsumerGroup(client_conf(settings), name, settings.topic) as group:
            outcome = _move_forward(group, ledger, published)
    except KafkaException as exc:
        outcome = {"group": name, "warning": _refusal(name, exc)}
    if "warning" in outcome:
        log.warning(
            "slice %s is published, but consumer group %s was not moved: %s",
            published.slice_id,
            name,
            outcome["warning"],
        )
    else:
        log.info("consumer group %s: %s", name, outcome)
    ledger.record_step(published.slice_id, "acknowledge", outcome)
    return outcome


def _move_forward(group: ConsumerGroup, ledger: Ledger, published: Slice) -> dict[str, Any]:
    members = group.members()
    if members:
        return {
            "group": group.name,
            "warning": f"{members} consumer(s) are running in group {group.name}; give them "
            "another group id, or set consumer_group in the pipeline's definition "
            f"({RUNBOOK})",
        }
    held = group.committed(published.ranges)
    base = _held_slice(ledger, held)
    target, unpublished = _published_run(ledger, base, published)
    committed = None
    while target is not None and target != base:
        upper = {p: hi for p, (_, hi) in target.ranges.items()}
        held = group.committed(upper)
        at = {p: held[p][0] if p in held else -1 for p in upper}
        if at == upper or any(at[p] > o for p, o in upper.items()):
            break  # at this boundary or past it: a newer slice's publication moved it
        gone = sorted(set(upper) - group.partitions())
        if gone:
            return {
                "group": group.name,
                "warning": f"the topic no longer has partition(s) {gone} of slice "
                f"{target.slice_id}; the group stays where it was",
            }
        group.commit(upper, metadata=target.slice_id)
        # Publications racing: each looks again after its commit, so the last to land
        # carries the newest run recorded before it.
        committed = base = target
        target, unpublished = _published_run(ledger, target, published)
    outcome: dict[str, Any] = {"group": group.name}
    if committed is not None:
        outcome["committed"] = committed.slice_id
    else:  # a backfill, a rerun, or a newer slice's commit already past it
        outcome["held"] = sorted({m or "?" for _, m in held.values()})
    if unpublished is not None:
        outcome["waits_for"] = unpublished.slice_id
    return outcome


def _held_slice(ledger: Ledger, held: dict[int, tuple[int, str | None]]) -> Slice | None:
    """The slice whose boundary the group holds (its commits' metadata), if one of ours."""
    named = {m for _, m in held.values()}
    if len(named) != 1 or None in named:
        return None
    try:
        return ledger.load_slice(named.pop())
    except SliceNotPlanned:
        return None


def _published_run(
    ledger: Ledger, after: Slice | None, published: Slice
) -> tuple[Slice | None, Slice | None]:
    """The newest slice of the run of published slices that follows `after` (the slice
    whose boundary the group holds; None: no run), and the first slice after the run not
    yet published (None: none): the group never passes a slice whose records gold does
    not hold. Reads the slices planned since `after` ends, most often one or two; with
    no `after` (a group new to the pipeline), the latest page of slices up to
    `published`."""
    if after is None:
        following = [sl for sl in ledger.latest_slices(PAGE) if sl.start <= published.start]
    else:
        following = ledger.latest_slices(FOLLOWING, since=after.end)
    end = after
    for sl in following:
        if ledger.step(sl.slice_id, "publish") is None:
            return end, sl
        end = sl
    return end, None


def _refusal(name: str, exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    code = error.code() if isinstance(error, KafkaError) else None
    text = error.str() if isinstance(error, KafkaError) else str(exc)
    if code in (KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED):
        return (
            f"{text}: the pipeline's Kafka principal needs READ on group {name} and on the "
            f"topic ({RUNBOOK})"
        )
    return f"{text} ({RUNBOOK})"
