"""Which slices a commit to silver wrote for: the tag each slice step's commit carries.

Every write a slice step makes to silver (its MERGE, a replay's withdrawal and the
copies a replay brings in from other slices) carries, in its commit's userMetadata,
the slices whose gate must see its rows: `slicewise slices=<id>[,<id>] attempt=<hex>`.
The tag is in the same atomic commit as the rows, so silver's own history says which
versions hold rows of which slices, and cannot disagree with the table (`publish`
reads it against the gates' records). A commit without one (silver's creation, a new
column, maintenance's compaction and purge) changes no row.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

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
