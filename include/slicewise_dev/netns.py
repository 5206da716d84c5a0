"""Other hosts on one machine: network namespaces on a private bridge (needs root).

Each `Hosts.add` makes a namespace with one veth link into a bridge that lives in the
root namespace. Every "host" then has an address of its own on one /24, and reaches
the root namespace only at the bridge's address (`gateway`): 127.0.0.1 inside a
namespace is that namespace's own loopback. So a service that another host must reach
binds the gateway address, and its clients in the root namespace use it too: one URL
for everyone, as on a real network.

Nothing leaves the bridge: no default route, no NAT, no forwarding. The /24 is picked
among 10.251.0.0/16's free ones, so tests (and two suites) running at once never share
one. Leaving the `with` removes every namespace (and its processes) and the bridge.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence

PREFIX = "10.251"  # private, and not the resolver's 10.255.255.0/24


def _ip(*argv: str) -> str:
    return subprocess.run(["ip", *argv], check=True, capture_output=True, text=True).stdout


def _free_subnet() -> str:
    """A 10.251.k.0/24 no interface of this machine has an address in."""
    used = {
        str(ipaddress.ip_interface(word).network)
        for line in _ip("-o", "-4", "addr", "show").splitlines()
        for word in line.split()
        if "/" in word and word[0].isdigit()
    }
    free = [k for k in range(1, 255) if f"{PREFIX}.{k}.0/24" not in used]
    assert free, f"every {PREFIX}.k.0/24 is in use"
    return f"{PREFIX}.{random.choice(free)}"


class Hosts:
    """Namespaces standing in for other hosts, on a bridge at `gateway` (see the module)."""

    def __init__(self) -> None:
        assert os.geteuid() == 0, "network namespaces need root (the CI runs as root)"
        self.tag = uuid.uuid4().hex[:6]
        self.bridge = f"swbr{self.tag}"
        self.net = _free_subnet()
        self.gateway = f"{self.net}.1"
        self.names: list[str] = []

    def __enter__(self) -> Hosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def add(self, role: str) -> tuple[str, str]:
        """A new host: its namespace's name and its address."""
        index = len(self.names) + 2
        ns, address = f"sw-{role}-{self.tag}", f"{self.net}.{index}"
        outside = f"sw{self.tag}{index}"  # at most 15 characters, as Linux wants
        self.names.append(ns)
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        return ns, address

    @staticmethod
    def command(ns: str, argv: Sequence[str]) -> list[str]:
        """`argv` run on that host (`ip netns exec` execs it: the pid stays the child's)."""
        return ["ip", "netns", "exec", ns, *argv]

    @staticmethod
    def pids(ns: str) -> list[int]:
        return [int(p) for p in _ip("netns", "pids", ns).split()]

    def kill(self, ns: str, sig: int = signal.SIGKILL) -> list[int]:
        """Every process on that host, as a host that loses power: the pids it had."""
        killed = self.pids(ns)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 30
        while self.pids(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
        return killed

    def __exit__(self, *_exc: object) -> None:
        for ns in self.names:
            with contextlib.suppress(subprocess.CalledProcessError):
                self.kill(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # and its veth
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def hostname() -> str:
    """This network namespace's own address (its first global IPv4 one), else the host
    name: Airflow's `hostname_callable` for a worker on a stand-in host, so a task
    instance records the host it ran on (namespaces share the machine's host name)."""
    for line in _ip("-o", "-4", "addr", "show", "scope", "global").splitlines():
        return line.split()[3].split("/")[0]
    return socket.getfqdn()
