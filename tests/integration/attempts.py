"""Step attempts forked from a preloaded process, for the chaos suite.

Every attempt of a step used to be a fresh `slicewise` process: Python's start, then
Great Expectations, PySpark's Connect client and our modules imported (seconds a
process on 2 cores) before the step did anything. Here one process (`serve`) imports
them once, as `slicewise.preloaded_scheduler` does for Airflow's LocalExecutor, and
forks each attempt from itself. The attempt is then what a task's process is: it calls
`setsid()` (its own process group, so SIGKILL, SIGSTOP and SIGCONT of the group reach
all of it, as before), takes the attempt's environment, writes to its log, opens its
own Spark session and runs `slicewise.cli.main` to its exit code.

Nothing in the server opens a connection, a session or a thread before it forks: it is
one thread reading requests (JSON lines on stdin) and reaping children (SIGCHLD on a
wakeup pipe), so a fork inherits only loaded code.

The harness side, `Forker`, hands back `Attempt`s with the part of `subprocess.Popen`
the suite uses (`pid`, `poll`, `wait`, `returncode`: a negative signal number for a
killed attempt, as Popen's).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PRELOAD = ("slicewise.cli", "slicewise.preloaded_scheduler")
_WAKEUP: tuple[int, int] = (-1, -1)  # the server's SIGCHLD pipe, which an attempt closes


def _attempt(argv: list[str], env: dict[str, str], log: str) -> None:
    """In the forked child: become the attempt, run it, exit with its code."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    for end in _WAKEUP:
        os.close(end)
    code = 1
    try:
        from slicewise.cli import main

        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # what the console script would print, then exit 1
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The fork server: requests on stdin, `{"pid"}` and `{"exited", "code"}` on stdout."""
    import importlib

    from slicewise.preloaded_scheduler import preload

    for module in PRELOAD:
        importlib.import_module(module)
    preload()  # the gate's Great Expectations, the Connect client, the steps
    global _WAKEUP
    wake_r, wake_w = _WAKEUP = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    requests = sys.stdin.buffer
    pending = b""
    while True:
        readable, _, _ = select.select([requests, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                code = os.waitstatus_to_exitcode(status)
                out.write(json.dumps({"exited": pid, "code": code}) + "\n")
                out.flush()
        if requests in readable:
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                return  # the harness went away: so do we (attempts run on)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _attempt(request["argv"], request["env"], request["log"])
                out.write(json.dumps({"pid": pid}) + "\n")
                out.flush()


class Attempt:
    """One forked attempt: the part of `subprocess.Popen` the chaos suite uses."""

    def __init__(self, forker: Forker, number: int, pid: int) -> None:
        self._forker, self._number, self.pid = forker, number, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self._forker.exit_code(self._number)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._forker.changed:
            while (code := self._forker.exit_code(self._number)) is None:
                if not self._forker.alive():
                    raise RuntimeError(f"the fork server died; attempt {self.pid} is lost")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"attempt {self.pid}", timeout or 0)
                self._forker.changed.wait(left if left is not None else 1.0)
        self.returncode = code
        return code


class Forker:
    """The harness's end of one fork server; a context manager."""

    def __init__(self, log: Path) -> None:
        self._log = log.open("w")
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "import attempts; attempts.serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
        )
        # Per attempt, in launch order: its pid and its exit code. Not a map keyed by pid:
        # the kernel reuses pids (pid_max is 32,768 here and the JVMs' threads take them
        # too), and a stale exit under a reused pid made a new attempt look done at once.
        self.changed = threading.Condition()
        self._pids: list[int] = []
        self._codes: list[int | None] = []
        ready = json.loads(self._proc.stdout.readline() or "{}")
        if "ready" not in ready:
            raise RuntimeError(f"the fork server did not start; its log: {log}")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            message = json.loads(line)
            with self.changed:
                if "pid" in message:  # always before that attempt's exit
                    self._pids.append(message["pid"])
                    self._codes.append(None)
                else:  # the latest attempt under that pid: an earlier one had exited
                    pid = message["exited"]
                    mine = [i for i, p in enumerate(self._pids) if p == pid]
                    if mine:  # (not a child of ours: nothing else forks there)
                        self._codes[mine[-1]] = message["code"]
                self.changed.notify_all()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def exit_code(self, number: int) -> int | None:
        with self.changed:
            return self._codes[number]

    def launch(self, argv: list[str], env: dict[str, str], log: Path) -> Attempt:
        with self.changed:
            known = len(self._pids)
            self._proc.stdin.write(
                (json.dumps({"argv": argv, "env": env, "log": str(log)}) + "\n").encode()
            )
            self._proc.stdin.flush()
            while len(self._pids) == known:
                if not self.alive():
                    raise RuntimeError("the fork server died before it forked the attempt")
                self.changed.wait(1.0)
            return Attempt(self, known, self._pids[known])

    def __enter__(self) -> Forker:
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()
