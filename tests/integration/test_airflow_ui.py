"""`make airflow-ui` stops cleanly: nothing `airflow standalone` started outlives it."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from slicewise_dev.airflow_env import PASSWORDS_FILE
from slicewise_dev.broker import free_ports

pytestmark = pytest.mark.integration


def ui_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "slicewise_dev.airflow_env", *args]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "airflow standalone exited before it was up"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if b'"scheduler"' in answer.read() and answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"{url} did not answer in {timeout:.0f}s")


def described(procs: list[psutil.Process], port: int) -> dict[int, tuple[str, set[str]]]:
    """pid -> (command line, addresses it listens on at `port`) of each process still
    running: standalone's components start short-lived children, and one may exit (or
    wait to be reaped) between the listing and the look."""
    seen = {}
    for p in procs:
        try:
            ips = {
                c.laddr.ip
                for c in p.net_connections("inet")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port
            }
            seen[p.pid] = (" ".join(p.cmdline()), ips)
        except psutil.NoSuchProcess:  # a zombie is one too
            continue
    return seen


def test_stop_ends_airflow_standalone_and_every_process_it_started(tmp_path):
    (port,) = free_ports(1)
    env = {**os.environ, "SLICEWISE_STATE_DIR": str(tmp_path), "AIRFLOW__API__PORT": str(port)}
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")  # its own SQLite, not the test session's
    log = (tmp_path / "standalone.log").open("w")
    ui = subprocess.Popen(ui_command("standalone"), env=env, stdout=log, stderr=subprocess.STDOUT)
    tree: list[psutil.Process] = []
    try:
        wait_healthy(f"http://127.0.0.1:{port}/api/v2/monitor/health", ui)
        tree = psutil.Process(ui.pid).children(recursive=True)
        seen = described(tree, port)
        commands = " ".join(command for command, _ in seen.values())
        assert len(tree) >= 4 and "scheduler" in commands, commands
        # Only this machine reaches the UI, and only its owner reads the admin password.
        listening = set().union(*(ips for _, ips in seen.values()))
        assert listening == {"127.0.0.1"}, listening
        passwords = tmp_path / "airflow" / PASSWORDS_FILE
        assert "admin" in passwords.read_text()
        assert stat.S_IMODE(passwords.stat().st_mode) == 0o600

        stopped = subprocess.run(ui_command("stop"), env=env, capture_output=True, text=True)
        assert stopped.returncode == 0 and "Airflow stopped" in stopped.stdout, stopped
        assert ui.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(tree, timeout=10)
        left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert left == [], [" ".join(p.cmdline()) for p in left]
        again = subprocess.run(ui_command("stop"), env=env, capture_output=True, text=True)
        assert "not running" in again.stdout
    finally:
        # A failed check leaves nothing running either: standalone's children too.
        for p in [*tree, psutil.Process(ui.pid)] if ui.poll() is None else tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        log.close()
