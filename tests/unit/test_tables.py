"""Which errors count as a lost Delta commit race (the step then re-checks and retries),
and when a slice's write may find its idempotent-write id forgotten."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pyspark.errors.exceptions.connect import UnknownException

from slicewise.tables import ids_may_be_forgotten, is_commit_conflict


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


def test_a_slices_id_may_be_forgotten_only_once_its_interval_is_nearly_a_retention_old():
    # Ids kept 7 days, attempts of up to 2 h, clocks an hour apart: a slice's writes come
    # after its interval ends, so its ids last at least until then + 7 days.
    end = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
    week, attempt = timedelta(days=7), timedelta(hours=2)
    assert not ids_may_be_forgotten(end, week, attempt, now=end + timedelta(hours=1))
    assert not ids_may_be_forgotten(
        end, week, attempt, now=end + week - timedelta(hours=3, seconds=1)
    )
    assert ids_may_be_forgotten(end, week, attempt, now=end + week - timedelta(hours=3))
    assert ids_may_be_forgotten(end, week, attempt, now=end + timedelta(days=30))  # a backfill
    assert ids_may_be_forgotten(end.replace(tzinfo=None), week, attempt, now=end + week)
