"""Publish: rebuild gold (events per hour and the definition's `gold.group_by`) for the
hours a slice may have changed; a pipeline without `gold` only records the publication.

Runs only after the gate passed. Gold rows of the affected hours are recomputed
from silver and written with replaceWhere, so publishing a slice again yields
the same rows. The ledger records the latest publication of each slice (for
`slicewise status`), and the pipeline's Kafka consumer group moves to the slice's
upper boundary (slicewise.acknowledge); the Airflow task that announces the silver Asset reads it
and announces a slice once, asking Airflow's own Asset events whether it has.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import date

from pyspark.sql import SparkSession

from slicewise import key_index
from slicewise.acknowledge import acknowledge
from slicewise.commits import Commits, commits_above, last_commit
from slicewise.config import Settings
from slicewise.coverage import (
    Unowned,
    UnownedRange,
    acknowledged_through,
    first_unowned,
    require_owned,
)
from slicewise.errors import OperationalError
from slicewise.faults import fault_point
from slicewise.ledger import Ledger
from slicewise.slices import slice_interval
from slicewise.tables import (
    history,
    retry_on_conflict,
    table_exists,
    table_version,
    tagged_commit,
)
from slicewise.transforms import events_per_hour, hours_sql, window_hours
from slicewise.windows import Reach, silver_window, slice_reach

log = logging.getLogger(__name__)


class GateNotPassed(OperationalError):
    """Publication was asked for a slice whose gate has not passed."""


@dataclass(frozen=True)
class Publication:
    slice_id: str
    silver_version: int
    gold_version: int | None
    hours: list[str]  # [first, last] hour rebuilt (UTC), or empty
    far_dates: list[str] = field(default_factory=list)  # dates beyond them rebuilt too


def run_publish(
    spark: SparkSession, settings: Settings, slice_id: str, accept_truncated_history: bool = False
) -> Publication:
    ledger = Ledger.of(settings)
    gate = ledger.step(slice_id, "gate")
    if not gate or not gate.get("success"):
        raise GateNotPassed(
            f"slice {slice_id}: the gate has not passed since its last MERGE (ledger: {gate}); "
            "run the gate first, nothing was published."
        )
    # Nothing is published past offsets no slice owns (an interval the scheduler skipped).
    require_owned(
        ledger, ledger.load_slice(slice_id), settings.publish_wait_seconds, settings.pipeline.dag_id
    )
    silver_path = settings.table("silver")
    if accept_truncated_history:
        require_gates_passed(ledger, slice_id)
    version = verified_version(spark, settings, ledger, slice_id, accept_truncated_history)
    if accept_truncated_history:
        ledger.record_step(slice_id, "truncated_history_ack", {"silver_version": version})
    # The hours to rebuild are the slice's whole reach (its dedup-horizon window and far
    # dates), not only its own hours: its MERGE may have replaced a stored copy by an
    # earlier-positioned one with another occurred_at, moving that event out of an hour
    # published before. Only rows inside the reach can have moved.
    reach = widened(gate_reach(spark, settings, gate, slice_id), ledger.step(slice_id, "replay"))
    gold_path = settings.table("gold_events_per_hour")
    gold = settings.pipeline.gold
    hours: list[str] = []
    gold_version = None
    if reach is not None and gold is not None:
        ranges = [window_hours(r) for r in reach.ranges()]
        hours = list(ranges[0])

        attempts = 0

        def rebuild() -> int:
            nonlocal version, attempts
            attempts += 1
            built, read = gold_state(spark, gold_path)
            if attempts > 1:  # a retry after a lost race: silver may have moved on
                version = verified_version(
                    spark, settings, ledger, slice_id, accept_truncated_history
                )
            # Never an older view than gold already shows: that view was proved when
            # its publication read it, and it holds this slice's commits or more. (A
            # slice with a reach merged, so silver and `version` exist.)
            version = max(int(version), built)
            attempt = uuid.uuid4().hex
            (
                events_per_hour(
                    silver_window(spark, settings, reach, version),
                    ranges,
                    settings.pipeline.column_of(settings.pipeline.event_time),
                    tuple(settings.pipeline.column_of(p) for p in gold.group_by),
                )
                .write.format("delta")
                .mode("overwrite")
                .option("replaceWhere", hours_sql(ranges))
                .option("txnAppId", GOLD_WRITER)
                .option("txnVersion", fence(version, read))
                .option("userMetadata", f"{BUILT_FROM}{version} {slice_id} attempt={attempt}")
                .save(gold_path)
            )
            commit = tagged_commit(spark, gold_path, attempt)
            if commit is None:
                raise GoldMovedOn(
                    f"slice {slice_id}: other publications kept committing to gold first "
                    f"(from silver v{version} or newer); nothing of this one was written. "
                    "Clear this task: it rebuilds from the newer view."
                )
            return int(commit.version)

        # Two runs publishing at once (a backfill, two at a time) may both create gold, or
        # rewrite overlapping hours: the loser (a commit conflict, or a write Delta skipped
        # under gold's fence) recomputes its hours from silver's latest verified version.
        gold_version = retry_on_conflict(rebuild, f"gold of {slice_id}", also=GoldMovedOn)
    elif table_exists(spark, gold_path):
        gold_version = table_version(spark, gold_path)
    fault_point("publish.gold_written", settings, slice_id)
    publication = Publication(
        slice_id=slice_id,
        silver_version=version if version is not None else table_version(spark, silver_path),
        gold_version=gold_version,
        hours=hours,
        far_dates=[] if reach is None or not hours else [d.isoformat() for d in reach.far],
    )
    ledger.record_step(slice_id, "publish", asdict(publication))
    if version is not None:
        ledger.raise_verified_floor(version)
    log.info("published %s: gold hours %s", slice_id, hours or "none")
    acknowledge(settings, ledger, ledger.load_slice(slice_id))
    # Once published: the slices recorded since the key index's last run, if enough
    # of them, become a run of it, so the next slices' lookups stay short.
    key_index.flush(spark, settings)
    return publication


def require_gates_passed(ledger: Ledger, slice_id: str) -> None:
    """Refuse to publish over a cut log unless every slice not yet published that read its
    records (bronze recorded: its MERGE may have committed where the log was cut) has a
    passing gate: the commits the walk can no longer read are then all proved."""
    unproved = [
        sl.slice_id
        for sl in ledger.latest_slices(1 << 62, since=acknowledged_through(ledger))
        if ledger.step(sl.slice_id, "publish") is None
        and ledger.step(sl.slice_id, "bronze") is not None
        and not (ledger.step(sl.slice_id, "gate") or {}).get("success")
    ]
    if unproved:
        raise GateNotPassed(
            f"slice {slice_id}: --accept-truncated-history refused: slice(s) "
            f"{', '.join(unproved)} merged into silver and have no passing gate; their commits "
            "may be where the log was cut. Run their gates until each passes "
            "(docs/RUNBOOK.md#gate-failed), then publish again. Nothing was published."
        )


# Gold's writes carry one idempotent-write id: Delta skips a write whose txnVersion is not
# above the last one committed under it, and fails one that races it at commit. The
# version puts the silver version the rows were built from above the gold version the
# write read, so no publication from an older view of silver lands after one from a
# newer view (replaceWhere reads gold as it is when the write starts, so Delta's conflict
# check alone lets it through), and two from one view, over other hours, both land.
GOLD_WRITER = "slicewise.publish"
BUILT_FROM = "slicewise built_from="


def fence(silver_version: int, gold_read: int) -> int:
    """Gold's txnVersion for rows built from `silver_version`, written over `gold_read`."""
    return silver_version * 2**32 + gold_read + 1


def gold_state(spark: SparkSession, path: str) -> tuple[int, int]:
    """The silver version gold was last built from, and gold's version ((-1, -1): no gold
    yet; built -1: gold predates the fence, or its last build is 50 commits back)."""
    if not table_exists(spark, path):
        return -1, -1
    rows = history(spark, path, 50).collect()
    built = next(
        (
            int(r.userMetadata[len(BUILT_FROM) :].split(" ", 1)[0])
            for r in rows
            if (r.userMetadata or "").startswith(BUILT_FROM)
        ),
        -1,
    )
    return built, max(int(r.version) for r in rows)


class GoldMovedOn(OperationalError):
    """Delta skipped a gold write under the fence: a publication from a newer view of
    silver (or from the same view over gold as it is now) committed first. Publication
    rebuilds on its own; this reaches on-call only after every retry lost."""


def gate_reach(spark: SparkSession, settings: Settings, gate: dict, slice_id: str) -> Reach | None:
    """The reach the slice's passing gate looked at. Its lookup came after every commit of
    the slice it proved (publication refuses one it has not seen), so it holds every date
    they changed; a gate recorded before gates kept their reach: looked up again."""
    if "reach" in gate:
        return Reach.of_record(gate["reach"])
    return slice_reach(spark, settings, slice_id)


def widened(reach: Reach | None, replay: dict | None) -> Reach | None:
    """The slice's reach, widened by the event dates a replay of it changed (rows it
    withdrew, other slices' copies it brought in: `replay.withdraw_stricter`)."""
    changed = (replay or {}).get("changed")
    if not changed:
        return reach
    lo, hi = (date.fromisoformat(d) for d in changed)
    return Reach((lo, hi)) if reach is None else reach.widened(lo, hi)


def verified_version(
    spark: SparkSession,
    settings: Settings,
    ledger: Ledger,
    slice_id: str,
    accept_truncated: bool = False,
) -> int | None:
    """The version of silver publication reads for the slice (None: no silver yet): what
    gold is rebuilt from and the Asset event names. It holds the slice's own commits,
    and every commit to silver at or below it was seen by a passing gate of the slices
    it wrote for, run at or below it (`proved_prefix`): silver's own tagged history
    (`commits`) against the gates' records, nothing that a retry, a replay or a second
    pipeline could move.

    A slice that committed earlier and whose gate has not run yet holds publication:
    it waits for that gate, up to `publish_wait_seconds` (a slice in flight passes in
    seconds); slices that commit later cannot delay it. A failed gate below stops it at
    once, naming the slice: what a gate rejected never reaches gold, the Asset or the
    consumer group, not even through another slice's publication, until it is repaired
    and passes. Nor do the rows of a slice past a range no slice owns: the version
    stops below its first commit, as below a gate not yet run (`slicewise.coverage`)."""
    path = settings.table("silver")
    if not table_exists(spark, path):
        return None
    deadline = time.monotonic() + settings.publish_wait_seconds
    while True:
        floor = ledger.verified_floor()
        commits = commits_above(spark, path, floor, accept_truncated)
        # After the commits: each slice they name was planned before it committed, so a
        # range this finds unowned was unowned when they were read.
        gap = first_unowned(ledger)
        own = ledger.step(slice_id, "gate") or {}
        proved = proved_prefix(
            floor,
            commits,
            lambda s: ledger.step(s, "gate"),
            past(gap),
            int(own["silver_version"]) if own.get("success") and "silver_version" in own else -1,
        )
        last = last_commit(commits, slice_id)
        mine = None if last is None else last.version
        if mine is None or proved.version >= mine:
            return proved.version
        if proved.by_hand is not None and not proved.pending and not proved.failed:
            raise GateNotPassed(
                f"slice {slice_id}: silver holds a write by hand at version {proved.by_hand} "
                "(a commit of no slice step that changed rows) that no gate has seen; run this "
                "slice's gate again, which validates silver as it is now, then publish. "
                "Nothing was published."
            )
        if slice_id in proved.pending:
            raise GateNotPassed(
                f"slice {slice_id}: silver holds a commit of it (version {mine}) that its "
                "gate has not seen (a retried ingest, a replay, or a racing slice's clean-up "
                "of a key stored twice since); run its gate again, "
                "nothing was published."
            )
        if proved.failed or time.monotonic() > deadline:
            if gap is not None and not proved.failed and proved.beyond:
                raise UnownedRange(slice_id, gap, ledger.topic, settings.pipeline.dag_id)
            raise PublicationBlocked(slice_id, proved.failed, proved.pending)
        log.info("publish of %s waits for the gate of %s", slice_id, ", ".join(proved.pending))
        time.sleep(2)


def past(gap: Unowned | None) -> Callable[[str], bool]:
    """Whether a slice lies past the range `gap` (None: no range unowned): it starts at or
    after the range's first offset no slice owns."""
    return lambda s: gap is not None and slice_interval(s)[0] >= gap.start


@dataclass(frozen=True)
class Proved:
    version: int  # the newest version publication may read
    failed: list[str]  # the slices whose failed gate stops it above
    pending: list[str]  # the slices whose gate has not seen their commit above it
    beyond: bool = False  # a pending slice lies past a range no slice owns
    by_hand: int | None = None  # a write by hand no passing gate has seen, where it stops


def proved_prefix(
    floor: int,
    commits: Commits,
    gate_of: Callable[[str], dict | None],
    beyond: Callable[[str], bool] = lambda _: False,
    seen_by: int = -1,
) -> Proved:
    """The newest version V at or above `floor` (a version already published, so proved)
    such that each commit above `floor` up to V was seen by a passing gate of every
    slice it wrote for, that gate run at a version at or below V: each row V holds was
    then in the version some passing gate validated. Walks `commits` oldest first and
    stops at the first commit no such gate saw, or of a slice `beyond` a range no slice
    owns (as pending: it publishes once the range is run). A write by hand (a commit
    of no slice step that changed rows) is proved once a passing gate ran at or above
    it: one of the gates walked, or the publishing slice's own (`seen_by`)."""
    need = best = floor
    unseen = None  # the first write by hand no passing gate has seen
    for commit in commits:
        version, slices = commit.version, commit.slices
        failed, pending = [], []
        past = [s for s in slices if beyond(s)]
        for s in slices:
            gate = gate_of(s) or {}
            seen = gate.get("silver_version")
            if s in past:
                pending.append(s)
            elif gate.get("success") and seen is not None and seen >= version:
                need = max(need, int(seen))
            elif gate.get("success") is False:
                failed.append(s)
            else:
                pending.append(s)
        if failed or pending:
            return Proved(best, sorted(failed), sorted(pending), bool(past), unseen)
        if commit.by_hand and unseen is None:
            unseen = version
        if unseen is not None and max(need, seen_by) >= unseen:
            unseen = None
        if unseen is None and version >= need:
            best = version
    return Proved(best, [], [], by_hand=unseen)


class PublicationBlocked(OperationalError):
    """Silver holds rows of another slice that its gate has not proved (it failed, or has
    not run): publishing now would pass them downstream."""

    def __init__(self, slice_id: str, failed: list[str], pending: list[str]) -> None:
        self.failed, self.pending = failed, pending
        if failed:
            why = (
                f"slice(s) {', '.join(failed)} failed the gate, and silver holds their rows. "
                "Nothing is published past a failed gate: repair it (docs/RUNBOOK.md#gate-failed) "
                "and run its gate again until it passes, then clear this task."
            )
        else:
            why = (
                f"slice(s) {', '.join(pending)} merged into silver but their gate has not "
                "passed yet (still running, or its run stopped before the gate). Run their "
                "gate (clear the `gate` task of their run, or `slicewise gate --slice-id "
                "...`), then clear this task."
            )
        super().__init__(
            f"slice {slice_id} was NOT published: {why} Nothing downstream changed "
            "(docs/RUNBOOK.md#publication-blocked)."
        )
