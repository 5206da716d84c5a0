"""The stand-in for other hosts (slicewise_dev.netns): a namespace reaches the root
namespace only at the bridge's address, never its loopback; killing a host ends every
process on it; nothing is left behind."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request

import pytest
from pyspark.sql import functions as F

from slicewise.connect_server import SparkConnectServer
from slicewise.spark import remote_session
from slicewise_dev.broker import free_ports
from slicewise_dev.netns import Hosts
from slicewise_dev.spark_cluster import LocalSparkCluster

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
        assert hosts.pids(ns) == [sleeper.pid]
        assert hosts.kill(ns) == [sleeper.pid]
        assert sleeper.wait(10) < 0 and hosts.pids(ns) == []
        names = (ns, hosts.bridge)
    assert not [n for n in names if n in subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True).stdout]  # fmt: skip
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_executors_on_another_host_run_the_queries_of_a_connect_client(tmp_path):
    """A standalone worker in its own namespace; the Connect server's driver on the
    gateway (`--bind`, `--driver-host`): a client's query runs on that host's executor,
    as Spark's own REST API tells, and writes a Delta table."""
    with Hosts() as hosts:
        ns, address = hosts.add("executor")
        cluster = LocalSparkCluster(
            tmp_path / "cluster", cores=1, memory="1g", master_host=hosts.gateway,
            worker=(ns, address),
        )  # fmt: skip
        port, ui = free_ports(2)
        with cluster, SparkConnectServer(
            tmp_path / "server", port, cluster.master_url, bind=hosts.gateway,
            driver_host=hosts.gateway, extra_conf={"spark.ui.port": str(ui)},
        ) as server:  # fmt: skip
            spark = remote_session(server.url, token=server.token, fresh=True)
            table = str(tmp_path / "numbers")
            spark.range(1000).withColumn("bucket", F.col("id") % 10).write.format("delta").save(
                table
            )
            assert spark.read.format("delta").load(table).count() == 1000
            spark.stop()
            api = f"http://{hosts.gateway}:{ui}/api/v1/applications"
            (app,) = fetch(api)
            executors = fetch(f"{api}/{app['id']}/allexecutors")
    ran = [e for e in executors if e["id"] != "driver" and e["totalTasks"] > 0]
    assert ran and {e["hostPort"].split(":")[0] for e in ran} == {address}, executors
    (driver,) = [e for e in executors if e["id"] == "driver"]
    assert driver["hostPort"].startswith(f"{hosts.gateway}:")


def fetch(url: str) -> list:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)
