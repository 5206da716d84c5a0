"""A real Spark standalone cluster: one master, one worker, from the pyspark wheel.

For the cluster-mode tests and for trying the DAG against a cluster by hand. The
DAG does not know about it: point the `spark_default` connection at
`master_url` and the same jobs run here instead of in `local[*]`.

On loopback by default. Given a worker host (`slicewise_dev.netns`: a namespace and
its address), the worker and its executors run there, and the master listens on the
address that host reaches (`master_host`, the namespaces' gateway).

    python -m slicewise_dev.spark_cluster [--cores 2] [--memory 4g]   # runs until Ctrl-C
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from slicewise_dev.broker import free_ports
from slicewise_dev.netns import Hosts
from slicewise_dev.process import Child, wait_until

SPARK_CLASS = Path(sys.executable).parent / "spark-class"
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


class LocalSparkCluster:
    """Master and worker as child JVMs; logs and the worker's scratch space under `home`."""

    def __init__(
        self,
        home: Path,
        cores: int = 2,
        memory: str = "4g",
        master_host: str = "127.0.0.1",
        worker: tuple[str, str] | None = None,
    ) -> None:
        self.home = Path(home)
        self.cores = cores
        self.memory = memory
        self.master_host = master_host
        # (namespace, address) of the worker's host; None: this host, on loopback.
        self.worker_ns, self.worker_host = worker or (None, master_host)
        self.port, self.webui_port, self.worker_port, self.worker_webui_port = free_ports(4)
        self._children: list[Child] = []

    @property
    def master_url(self) -> str:
        return f"spark://{self.master_host}:{self.port}"

    def state(self) -> dict:
        """The master's own JSON status page: workers, running and completed applications."""
        url = f"http://{self.master_host}:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)

    def completed_apps(self) -> list[str]:
        return [app["name"] for app in self.state().get("completedapps", [])]

    def start(self, timeout: float = 120.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": self.master_host,
            # Executors run Python with the same interpreter (and packages) as the driver's venv.
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_WORKER_DIR": str(self.home / "work"),
        }
        self._spawn(
            "master",
            [
                MASTER,
                "--host", self.master_host,
                "--port", str(self.port),
                "--webui-port", str(self.webui_port),
            ],
            env,
        )  # fmt: skip
        self._spawn(
            "worker",
            [
                WORKER,
                "--host", self.worker_host,
                "--port", str(self.worker_port),
                "--webui-port", str(self.worker_webui_port),
                "--cores", str(self.cores),
                "--memory", self.memory,
                "--work-dir", str(self.home / "work"),
                self.master_url,
            ],
            {**env, "SPARK_LOCAL_IP": self.worker_host},
            ns=self.worker_ns,
        )  # fmt: skip
        wait_until(
            self._worker_alive,
            self._children,
            f"the Spark cluster at {self.master_url} (a worker registered)",
            timeout,
            interval=1,
        )

    def stop(self, timeout: float = 30.0) -> None:
        for child in reversed(self._children):  # worker first, so the master sees it leave
            child.stop(timeout)
        self._children.clear()

    def __enter__(self) -> LocalSparkCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str], ns: str | None = None
    ) -> None:
        command = [str(SPARK_CLASS), *args]
        if ns is not None:
            command = Hosts.command(ns, command)
        self._children.append(Child(command, self.home / f"{name}.log", env))

    def _worker_alive(self) -> bool:
        try:
            workers = self.state().get("workers", [])
        except OSError:
            return False  # the master's web UI is not up yet
        return any(w.get("state") == "ALIVE" for w in workers)


def main(argv: Sequence[str] | None = None) -> int:
    from slicewise.config import load_settings

    parser = argparse.ArgumentParser(
        prog="python -m slicewise_dev.spark_cluster", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--memory", default="4g")
    args = parser.parse_args(argv)
    cluster = LocalSparkCluster(load_settings().state_dir / "spark", args.cores, args.memory)
    with cluster:
        print(
            f"Spark master {cluster.master_url} (UI http://127.0.0.1:{cluster.webui_port}); "
            f"point spark_default at it, e.g.\n"
            f'  export AIRFLOW_CONN_SPARK_DEFAULT=\'{{"conn_type": "spark", "host": '
            f'"{cluster.master_url}"}}\'\nCtrl-C stops it.',
            flush=True,
        )
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
