"""Acknowledge: after a slice is published, the end of the run of published slices
from the pipeline's origin becomes the committed offsets of its Kafka consumer group,
so the lag tools users already run see the pipeline: processing is complete up to
there once the gates proved those slices and publish ran.

The ledger stays the source of truth, and the group is never read back: the run is
walked in the ledger from its `acknowledged` mark (`slicewise.coverage`), never from
what the group holds, so a group whose offsets expired (`offsets.retention.minutes`)
or that someone reset is set again to where the ledger says, not past a slice waiting
for a repair. The run stops below the first slice not yet published and below any
range no slice owns, so a later interval published before an earlier one, or after
one the scheduler skipped, leaves the group below it. Every publication commits the
run's end, the same offsets again when nothing new joined it (a backfill of an older
interval, a rerun), which also restores an expired group. Kafka has no
compare-and-set for a group's offsets, so two publications at once could commit out
of order: each is recorded in the ledger before its commit, and after committing each
walks the run again and commits its new end if it grew, so the last commit to land
carries the newest run.

A commit that fails (no ACL, the broker away, a consumer in the group) is a warning
in the task log and in `slicewise status`, never a failed publication; the next
publication moves the group past it.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from slicewise.config import Settings
from slicewise.coverage import Unowned, acknowledged_through, run_from
from slicewise.kafka.consumer_group import ConsumerGroup
from slicewise.kafka.offsets import client_conf
from slicewise.ledger import Ledger
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
    committed = None
    target, stop = published_run(ledger)
    while target is not None and target != committed:
        upper = {p: hi for p, (_, hi) in target.ranges.items()}
        gone = sorted(set(upper) - group.partitions())
        if gone:
            return {
                "group": group.name,
                "warning": f"the topic no longer has partition(s) {gone} of slice "
                f"{target.slice_id}; the group stays where it was",
            }
        ledger.raise_mark("acknowledged", "through", target.end, slice_id=target.slice_id)
        group.commit(upper, metadata=target.slice_id)
        # Publications racing: each walks again after its commit, so the last to land
        # carries the newest run recorded before it.
        committed = target
        target, stop = published_run(ledger)
    outcome: dict[str, Any] = {"group": group.name}
    if committed is not None:
        outcome["committed"] = committed.slice_id
    if isinstance(stop, Slice):
        outcome["waits_for"] = stop.slice_id
    elif isinstance(stop, Unowned):
        outcome["waits_for"] = f"unowned {stop.describe()}"
    return outcome


def published_run(ledger: Ledger) -> tuple[Slice | None, Slice | Unowned | None]:
    """The last slice of the run of published slices from the origin (None: none yet),
    and what ends it: the first slice not yet published, or a range no slice owns (None:
    nothing planned past it). Reads the slices planned since the `acknowledged` mark."""
    through = acknowledged_through(ledger)
    if through is None:
        return None, None
    following = ledger.latest_slices(1 << 62, since=through)
    end, last, gap = run_from(
        through, following, counts=lambda sl: ledger.step(sl.slice_id, "publish") is not None
    )
    mark = ledger.mark("acknowledged")
    if last is None and mark is not None:
        last = ledger.load_slice(mark["slice_id"])
    waiting = next((sl for sl in following if sl.start == end), None)
    return last, gap or waiting


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
