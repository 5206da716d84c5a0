"""Acknowledge: after a slice is published, its upper boundary becomes the committed
offsets of the pipeline's Kafka consumer group, so the lag tools users already run see
the pipeline: processing is complete once the gate proved the slice and publish ran.

The ledger stays the source of truth; nothing reads the group to plan. The group only
moves forward: a backfill, or a rerun of an older slice, leaves it where it is. Kafka
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
from slicewise.ledger import PAGE, Ledger
from slicewise.slices import Slice

log = logging.getLogger(__name__)
RUNBOOK = "docs/RUNBOOK.md#the-consumer-group-was-not-moved"


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
    target = published
    while True:
        upper = {p: hi for p, (_, hi) in target.ranges.items()}
        held = group.committed(upper)
        at = {p: held[p][0] if p in held else -1 for p in upper}
        if at == upper or any(at[p] > o for p, o in upper.items()):
            # At this boundary or past it: a backfill, a rerun, or a newer slice's commit.
            return {"group": group.name, "held": sorted({m or "?" for _, m in held.values()})}
        gone = sorted(set(upper) - group.partitions())
        if gone:
            return {
                "group": group.name,
                "warning": f"the topic no longer has partition(s) {gone} of slice "
                f"{target.slice_id}; the group stays where it was",
            }
        group.commit(upper, metadata=target.slice_id)
        newer = _newest_published(ledger, after=target)
        if newer is None:
            return {"group": group.name, "committed": target.slice_id}
        target = newer


def _newest_published(ledger: Ledger, after: Slice) -> Slice | None:
    """The newest published slice that starts at or after `after` ends (bounded reads:
    only slices planned since, most often none)."""
    for sl in reversed(ledger.latest_slices(PAGE, since=after.end)):
        if ledger.step(sl.slice_id, "publish") is not None:
            return sl
    return None


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
