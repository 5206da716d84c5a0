"""The dev stack's child servers: started, waited for, stopped, all one way.

Each server (s3proxy, the schema registry, Airflow's components, a Spark master and
worker, nginx) runs in a session of its own, so a Ctrl-C in the terminal reaches only us and
stopping it ends whatever it started; its output goes to a log file whose tail goes
into every error. The Kafka broker is the exception: it outlives the process that
started it (a pid file finds it again), so `broker.py` keeps its own lifecycle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil


class StartFailed(RuntimeError):
    """A server exited, or did not answer in time, while starting; the message has its log."""


def end_tree(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM the process group of `pid` and every descendant (some start sessions of
    their own), then SIGKILL whatever is left after `timeout`."""
    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


class Child:
    """One server process in its own session, its output in `log`."""

    def __init__(
        self,
        command: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                list(command),
                env=None if env is None else dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def exited(self) -> bool:
        return self._proc.poll() is not None

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"{self.log}:\n" + "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the server and everything it started, nothing left to clean up (a
        host lost, kill -9)."""
        try:
            tree = [psutil.Process(self.pid), *psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(tree, timeout=10)
        self._proc.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """End the server and everything it started; a no-op once it has."""
        end_tree(self.pid, timeout)
        self._proc.wait()


def wait_until(
    ready: Callable[[], bool],
    children: Sequence[Child],
    what: str,
    timeout: float,
    interval: float = 0.5,
) -> None:
    """Return once `ready()` holds. If a child exits first, or `timeout` passes, stop them
    all and raise `StartFailed` naming `what`, with the tail of each log."""
    deadline = time.monotonic() + timeout
    while not ready():
        gone = [c for c in children if c.exited()]
        if gone or time.monotonic() > deadline:
            why = "exited" if gone else f"did not answer in {timeout:.0f}s"
            for child in reversed(children):
                child.stop()
            tails = "\n".join(c.tail() for c in (gone or children))
            raise StartFailed(f"{what} {why}; its log ends:\n{tails}")
        time.sleep(interval)
