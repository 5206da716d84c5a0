"""A PySpark Connect client bug that the test harness steps around.

PySpark 4.1's `SparkSession.__del__` closes its client, and closing a client shuts down
the ReleaseExecute thread pool that every client of the process shares
(`ExecutePlanResponseReattachableIterator.shutdown`). The harness drops sessions
(`remote_session(..., fresh=True)`, stopped, then collected whenever Python's cycle
collector runs), and the collector can run inside that pool's own `submit` or one of its
workers: the shutdown then waits for a lock its own thread holds, or joins its own pool.
Both CI workers hung so in a gate's side-by-side queries on 2026-11-30, for good.
Upstream: SPARK-55362 (shutdown without waiting) and SPARK-55406 (the pool reimplemented).

A step of ours runs in a process with one session, so it never drops one this way; the
harness runs many tests, and their sessions, in one process.
"""

from __future__ import annotations

from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator


def _detach(cls: type[ExecutePlanResponseReattachableIterator]) -> None:
    # Forget the pool instead of shutting it down: its idle workers exit once it is
    # collected, and a release already queued still runs. The next iterator makes a new one.
    with cls._lock:
        cls._release_thread_pool_instance = None


def detach_release_pool_on_close() -> None:
    """Make a client's close forget the shared release pool rather than shut it down
    (idempotent; a no-op on a PySpark whose iterator no longer has the shared pool)."""
    if hasattr(ExecutePlanResponseReattachableIterator, "_release_thread_pool_instance"):
        ExecutePlanResponseReattachableIterator.shutdown = classmethod(_detach)  # type: ignore[method-assign]
