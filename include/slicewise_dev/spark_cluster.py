"""A real Spark standalone cluster on loopback: one master, one worker, from the pyspark wheel.

For the cluster-mode tests and for trying the DAG against a cluster by hand. The
DAG does not know about it: point the `spark_default` connection at
`master_url` and the same jobs run here instead of in `local[*]`.

    python -m slicewise_dev.spark_cluster [--cores 2] [--memory 4g]   # runs until Ctrl-C
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from slicewise_dev.broker import free_ports

SPARK_CLASS = Path(sys.executable).parent / "spark-class"


class ClusterError(RuntimeError):
    """The master or the worker did not come up; the message carries its log."""


class LocalSparkCluster:
    """Master and worker as child JVMs; logs and the worker's scratch space under `home`."""

    def __init__(self, home: Path, cores: int = 2, memory: str = "4g") -> None:
        self.home = Path(home)
        self.cores = cores
        self.memory = memory
        self.port, self.webui_port, self.worker_port, self.worker_webui_port = free_ports(4)
        self._procs: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict:
        """The master's own JSON status page: workers, running and completed applications."""
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)

    def completed_apps(self) -> list[str]:
        return [app["name"] for app in self.state().get("completedapps", [])]

    def start(self, timeout: float = 120.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            # Executors run Python with the same interpreter (and packages) as the driver's venv.
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_WORKER_DIR": str(self.home / "work"),
        }
        self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1",
                "--port", str(self.port),
                "--webui-port", str(self.webui_port),
            ],
            env,
        )  # fmt: skip
        self._spawn(
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1",
                "--port", str(self.worker_port),
                "--webui-port", str(self.worker_webui_port),
                "--cores", str(self.cores),
                "--memory", self.memory,
                "--work-dir", str(self.home / "work"),
                self.master_url,
            ],
            env,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self._worker_alive():
            for name, proc in zip(("master", "worker"), self._procs, strict=True):
                if proc.poll() is not None:
                    self.stop()
                    raise ClusterError(f"Spark {name} exited:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                self.stop()
                raise ClusterError(
                    f"no worker registered with {self.master_url} after {timeout:.0f}s:\n"
                    f"{self.log_tail('master')}\n{self.log_tail('worker')}"
                )
            time.sleep(1)

    def stop(self, timeout: float = 30.0) -> None:
        for proc in reversed(self._procs):  # worker first, so the master sees it leave
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._procs.clear()

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.home / f"{name}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def __enter__(self) -> LocalSparkCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        with open(self.home / f"{name}.log", "w") as log:
            self._procs.append(
                subprocess.Popen(
                    [str(SPARK_CLASS), *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stop() ends the JVM too
                )
            )

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
