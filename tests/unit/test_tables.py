"""Which errors count as a lost Delta commit race (the step then re-checks and retries)."""

from __future__ import annotations

from pyspark.errors.exceptions.connect import UnknownException

from slicewise.tables import is_commit_conflict


def test_a_conflict_is_recognised_however_the_connect_client_rebuilt_it():
    # Seen in a race of two silver attempts: the class was not rebuilt, no condition set.
    unknown = UnknownException(
        message="[DELTA_CONCURRENT_TRANSACTION] ConcurrentTransactionException: This error ..."
    )
    assert unknown.getCondition() is None and is_commit_conflict(unknown)
    assert is_commit_conflict(RuntimeError("io.delta.exceptions.ConcurrentAppendException: x"))


def test_other_errors_are_not_conflicts():
    assert not is_commit_conflict(UnknownException(message="[DELTA_MISSING_DELTA_TABLE] x"))
    assert not is_commit_conflict(RuntimeError("disk full; DELTA_CONCURRENT_ mentioned later"))
