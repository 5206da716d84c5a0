"""Which slices a commit to silver wrote for: the tag each slice step's commit carries.

Every write a slice step makes to silver (its MERGE, a replay's withdrawal and the
copies a replay brings in from other slices) carries, in its commit's userMetadata,
the slices whose gate must see its rows: `slicewise slices=<id>[,<id>] attempt=<hex>`.
The tag is in the same atomic commit as the rows, so silver's own history says which
versions hold rows of which slices, and cannot disagree with the table (`publish`
reads it against the gates' records). A tag may name no slice: a clean-up that only
deleted rows every owner's passing gate had seen once (`silver.settle_far_copies`). A
commit without one is silver's creation, a new column, maintenance's compaction and
purge (no row changed), or a write by hand (`Commit.by_hand`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from pyspark.sql import SparkSession

from slicewise.errors import OperationalError
from slicewise.tables import history, latest_commit

PREFIX = "slicewise slices="


def slice_tag(slices: Iterable[str], attempt: str | None = None) -> str:
    """The userMetadata of a commit of `slices`' rows; `attempt` finds it again."""
    return f"{PREFIX}{','.join(sorted(set(slices)))} attempt={attempt or uuid.uuid4().hex}"


def tagged_slices(user_metadata: str | None) -> tuple[str, ...]:
    """The slices a commit's userMetadata names (none: the commit changed no row)."""
    if not user_metadata or not user_metadata.startswith(PREFIX):
        return ()
    named = user_metadata[len(PREFIX) :].split(" ", 1)[0]
    return tuple(s for s in named.split(",") if s)


# Delta operations that change no row: silver's creation and schema, its maintenance.
NO_ROW_CHANGE = frozenset(
    {
        "CREATE TABLE",
        "SET TBLPROPERTIES",
        "UNSET TBLPROPERTIES",
        "ADD COLUMNS",
        "CHANGE COLUMN",
        "UPGRADE PROTOCOL",
        "OPTIMIZE",
        "REORG",
        "VACUUM START",
        "VACUUM END",
    }
)


class Commit(NamedTuple):
    version: int
    slices: tuple[str, ...]  # the slices it wrote for (`tagged_slices`)
    at: int  # its timestamp, seconds since the epoch
    operation: str = "WRITE"
    tagged: bool = False  # a slice step's commit, though its tag may name no slice

    @property
    def by_hand(self) -> bool:
        """Rows changed by no slice step: a write of someone else's (a repair, a bad
        manual write)."""
        return not (self.slices or self.tagged) and self.operation not in NO_ROW_CHANGE


Commits = list[Commit]


def epoch_seconds(at: datetime) -> int:
    """A history row's commit time as epoch seconds. PySpark hands a timestamp over as a
    naive datetime in the client's own zone (its `fold` set where that zone's clock
    repeats an hour), which `timestamp()` reads back to the same instant."""
    return int(at.timestamp())


class HistoryTruncated(OperationalError):
    """Delta's log cleanup removed commits above the last version a publication read:
    which slices wrote there can no longer be read from the table."""

    def __init__(self, floor: int, oldest: int) -> None:
        self.floor, self.oldest = floor, oldest
        super().__init__(
            f"silver's log no longer holds versions {floor + 1}-{oldest - 1} (Delta's log "
            f"cleanup, delta.logRetentionDuration: the last publication read version {floor} "
            "longer ago than that, so every publication since was refused, likely behind a "
            "failed gate). Publication cannot tell whether a slice whose gate failed wrote "
            "rows there, and nothing was published. Safe action: `slicewise status` lists "
            "the slices not yet published; run the gate of each until every one passes "
            "(docs/RUNBOOK.md#gate-failed), then publish this slice once by hand with "
            "`slicewise publish --slice-id <id> --accept-truncated-history`, which walks "
            f"from version {oldest} (docs/RUNBOOK.md#silvers-log-was-cleaned-up)."
        )


def commits_above(
    spark: SparkSession, path: str, floor: int, accept_truncated: bool = False
) -> Commits:
    """The table's commits above version `floor`, oldest first; its latest version always
    among them. One `DESCRIBE HISTORY` of those commits only: `floor` is a version already
    proved (`Ledger.verified_floor`). Raises `HistoryTruncated` when the log no longer
    reaches down to `floor` (unless `accept_truncated`: then from its oldest commit)."""
    latest = latest_commit(spark, path)
    if latest.version <= floor:  # nothing above it: the latest version, already proved
        return [Commit(int(latest.version), (), epoch_seconds(latest.timestamp), "")]
    rows = [latest]
    if latest.version - floor > 1:
        rows = history(spark, path, latest.version - floor).collect()
    oldest = min(int(r.version) for r in rows)
    if oldest > floor + 1 and not accept_truncated:
        raise HistoryTruncated(floor, oldest)
    return sorted(
        Commit(
            int(r.version),
            tagged_slices(r.userMetadata),
            epoch_seconds(r.timestamp),
            r.operation,
            (r.userMetadata or "").startswith(PREFIX),
        )
        for r in rows
    )


def last_commit(commits: Commits, slice_id: str) -> Commit | None:
    """The newest of `commits` that wrote for the slice (None: none of them did)."""
    return max((c for c in commits if slice_id in c.slices), default=None)
