"""The dev stack's one way to start, wait for and stop a server (slicewise_dev.process),
on small shell processes standing in for the servers."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from slicewise_dev.process import Child, StartFailed, wait_until


def test_a_server_that_exits_while_starting_fails_with_the_end_of_its_log(tmp_path: Path) -> None:
    child = Child(["sh", "-c", "echo 'port 1 is taken'; exit 3"], tmp_path / "logs" / "server.log")
    with pytest.raises(StartFailed) as failed:
        wait_until(lambda: False, [child], "the server", timeout=30, interval=0.05)
    assert "the server exited" in str(failed.value)
    assert "port 1 is taken" in str(failed.value)


def test_a_server_that_never_answers_is_stopped_with_what_it_started(tmp_path: Path) -> None:
    # The shell starts a grandchild in a session of its own: stopping must end it too.
    # Its argument marks it as this test's own: other runs of the suite may be alive.
    mark = str(tmp_path)
    script = (
        f"{sys.executable} -c 'import os, time; os.setsid(); time.sleep(600)' {mark} & sleep 600"
    )
    child = Child(["sh", "-c", script], tmp_path / "server.log")
    with pytest.raises(StartFailed, match="did not answer in 1s"):
        wait_until(lambda: len(psutil.Process(child.pid).children()) == 99, [child], "x", 1)
    assert child.exited()
    sleepers = [p for p in psutil.process_iter(["cmdline"]) if mark in (p.info["cmdline"] or [])]
    assert not sleepers


def test_waiting_returns_once_the_server_answers(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = Child(["sh", "-c", f"sleep 0.2; touch {ready}; sleep 600"], tmp_path / "server.log")
    try:
        wait_until(ready.exists, [child], "the server", timeout=30, interval=0.05)
        assert not child.exited()
    finally:
        child.stop()
    assert child.exited()
