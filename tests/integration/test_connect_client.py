"""The harness's guard against PySpark's release-pool hang (`_forget_release_pool` in
this folder's conftest): a client closed while its own thread is inside the shared pool's
`submit`, where the cycle collector ran `SparkSession.__del__` when both CI workers hung
on 2026-11-30."""

from __future__ import annotations

import threading

import pytest
from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator as It

pytestmark = pytest.mark.integration


def test_a_client_closed_inside_the_release_pool_does_not_hang():
    pool = It._get_or_create_release_thread_pool()
    closed = threading.Event()

    def close_inside_submit() -> None:
        with pool._shutdown_lock:  # what `submit` holds while it builds the future
            It.shutdown()  # what a collected session's close calls
        closed.set()

    # A daemon thread: without the guard it blocks for good, and the test fails, not hangs.
    threading.Thread(target=close_inside_submit, daemon=True).start()
    assert closed.wait(10), "closing a client inside the release pool's submit hung"
    assert It._release_thread_pool_instance is not pool  # forgotten
    pool.submit(lambda: None).result(timeout=10)  # and still serving what it was given
    assert It._get_or_create_release_thread_pool() is not pool  # the next client's own
