"""The stand-in for other hosts (slicewise_dev.netns): a namespace reaches the root
namespace only at the bridge's address, never its loopback; killing a host ends every
process on it; nothing is left behind."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from slicewise_dev.netns import Hosts

pytestmark = pytest.mark.integration


def reach(hosts: Hosts, ns: str, address: str, port: int) -> int:
    """The errno of a TCP connect from host `ns` (0: connected)."""
    probe = f"import socket; print(socket.socket().connect_ex(({address!r}, {port})))"
    done = subprocess.run(
        hosts.command(ns, [sys.executable, "-c", probe]), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_a_host_reaches_the_gateway_only_and_is_gone_after(tmp_path):
    with Hosts() as hosts, socket.socket() as public, socket.socket() as loopback:
        ns, address = hosts.add("worker")
        assert address != hosts.gateway and address.startswith(hosts.net)
        public.bind((hosts.gateway, 0))
        loopback.bind(("127.0.0.1", 0))
        for s in (public, loopback):
            s.listen()
        assert reach(hosts, ns, hosts.gateway, public.getsockname()[1]) == 0
        assert reach(hosts, ns, "127.0.0.1", loopback.getsockname()[1]) != 0  # its own lo
        # Killing the host ends what runs on it.
        sleeper = subprocess.Popen(
            hosts.command(ns, [sys.executable, "-c", "import time; time.sleep(600)"])
        )
        # `ip netns exec` enters the namespace, then execs: until then the process is
        # still in the root namespace (seen once in CI on a loaded host).
        deadline = time.monotonic() + 30
        while not hosts.pids(ns) and time.monotonic() < deadline and sleeper.poll() is None:
            time.sleep(0.1)
        assert hosts.pids(ns) == [sleeper.pid]
        assert hosts.kill(ns) == [sleeper.pid]
        assert sleeper.wait(10) < 0 and hosts.pids(ns) == []
        names = (ns, hosts.bridge)
    assert not [n for n in names if n in subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True).stdout]  # fmt: skip
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
