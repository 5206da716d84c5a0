"""slicewise as a library: the wheel `python -m build` would make lists its dependencies
(ranges), ships the product and its package data and no dev stack, and installs from
PyPI's registry into fresh venvs on the oldest and newest Python it supports, where it
runs from a directory outside the checkout."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import zipfile
from datetime import datetime, timedelta, timezone
from email.parser import Parser
from pathlib import Path

import psutil
import pytest

from slicewise.connect_server import port_open
from slicewise.home import REPO_ROOT
from slicewise_dev.airflow_env import VENV_BIN
from slicewise_dev.broker import free_ports
from slicewise_dev.producer import Record, TxProducer, event_value

pytestmark = pytest.mark.integration

PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def interpreter(version: str) -> Path:
    """pyenv's `python<version>` (the machines have 3.10 to 3.13 beside the default)."""
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    assert found, f"no Python {version} under {PYENV}: install it with pyenv"
    return found[-1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Bounded, as every call here that may wait on the registry: a stalled download fails
    # this file with the command that stalled, not the whole suite's time.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO_ROOT)],
        check=True,
        timeout=600,
    )
    (built,) = out.glob("slicewise-*.whl")
    return built


def test_the_wheel_is_the_product_with_its_dependencies_and_no_dev_stack(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = Parser().parsestr(
            z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        )
    assert "slicewise/spark-jars.pom.xml" in names  # runtime data is package data
    modules = {
        *(f"slicewise/{p.relative_to(REPO_ROOT / 'include' / 'slicewise').as_posix()}"
          for p in (REPO_ROOT / "include" / "slicewise").rglob("*.py")),
        *(f"slicewise/spark_jobs/{p.name}" for p in (REPO_ROOT / "spark_jobs").glob("*.py")),
    }  # fmt: skip
    assert modules <= set(names), sorted(modules - set(names))  # every subpackage listed
    assert not [n for n in names if n.startswith("slicewise_dev")]
    assert metadata["Requires-Python"] == ">=3.10"
    requires = metadata.get_all("Requires-Dist")
    core = {r.split(";")[0].split("<")[0].split(">")[0] for r in requires if "extra ==" not in r}
    assert {"pyspark-client", "great-expectations", "confluent-kafka", "obstore"} <= core
    assert "pyspark" not in core  # the thin Connect client only: no JVM on a worker
    airflow = [r for r in requires if 'extra == "airflow"' in r]
    assert any(r.startswith("apache-airflow<4,>=3.2") for r in airflow)
    assert not [r for r in requires if "==" in r.split(";")[0]]  # ranges, never pins
    scripts = entry_points(wheel)
    assert "slicewise = slicewise.cli:main" in scripts and "slicewise-produce" not in scripts


def entry_points(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()


def install(wheel: Path, version: str, where: Path, extras: str = "") -> Path:
    """A fresh venv on Python `version` with the wheel installed from the registry's
    ranges (uv, from the dev venv); its folder."""
    venv = where / f"venv-{version}"
    uv = str(VENV_BIN / "uv")
    subprocess.run(
        [uv, "venv", "-q", "--python", str(interpreter(version)), str(venv)],
        check=True,
        timeout=120,
    )
    subprocess.run(
        [
            uv,
            "pip",
            "install",
            "-q",
            "--python",
            str(venv / "bin" / "python"),
            f"slicewise{extras} @ {wheel.as_uri()}",
        ],
        check=True,
        timeout=900,
    )
    return venv


@pytest.mark.parametrize("version", ["3.10", "3.13"])
def test_the_wheel_installs_and_runs_outside_the_checkout(wheel, version, tmp_path):
    venv = install(wheel, version, tmp_path)
    elsewhere = tmp_path / "deployment"  # a folder of its own: no checkout in sight
    elsewhere.mkdir()
    shutil.copy(
        REPO_ROOT / "docs" / "examples" / "two-pipelines.yaml", elsewhere / "pipelines.yaml"
    )
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AIRFLOW_HOME": str(elsewhere),
    }
    shown = subprocess.run(
        [str(venv / "bin" / "slicewise"), "pipelines"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    # The default definitions file is the deployment's (AIRFLOW_HOME), not the package's.
    assert f"{elsewhere / 'pipelines.yaml'}: 2 pipeline(s), all valid" in shown.stdout
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.util, slicewise, slicewise.spark as s; "
            "print(importlib.util.find_spec('slicewise_dev') is None, "
            "importlib.util.find_spec('py4j') is None, s.SPARK_POM.is_file(), slicewise.__file__)",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    no_dev, no_jvm_bridge, pom, where = probe.stdout.split()
    assert (no_dev, no_jvm_bridge, pom) == ("True", "True", "True")
    assert str(venv) in where and str(REPO_ROOT) not in where


def test_a_worker_without_java_runs_a_slice_on_sparks_own_connect_server(
    wheel, kafka_bootstrap, new_topic, spark, tmp_path
):
    """The deployment the README describes, on Python 3.12 (Airflow's images' default):
    `slicewise[airflow]` alone (no pyspark, no `java` on PATH) runs `airflow dags test`
    of a slice against a Spark Connect server started by the line `slicewise
    spark-server` prints (Spark's own server, our jars as --packages from Maven Central,
    no slicewise code on it), on a host whose time zone is not UTC (its JVM's and its
    sessions' default): the client sets UTC on its own session, so event dates and
    gold's hours are UTC."""
    topic = new_topic(3)
    at = datetime.now(timezone.utc).replace(hour=2, minute=30, second=0, microsecond=0) - timedelta(
        days=1
    )
    producer = TxProducer({"bootstrap.servers": kafka_bootstrap}, topic, f"tx-{topic}")
    producer.send([Record(event_value(f"e{i}", at), i % 3, at) for i in range(20)])
    # The server, as a team would start it from the printed line (here on New York time).
    token, port = secrets.token_hex(16), free_ports(1)[0]
    line = subprocess.run(
        [str(VENV_BIN / "slicewise"), "spark-server", "--port", str(port)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.replace("timeZone=UTC", "timeZone=America/New_York")
    logs = tmp_path / "server.log"
    with open(logs, "w") as log:
        server = subprocess.Popen(
            ["bash", "-c", line],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={
                **os.environ,
                "TZ": "America/New_York",  # the JVM's default zone
                "SLICEWISE_SPARK_TOKEN": token,
                "SLICEWISE_SPARK_PROPERTIES": str(tmp_path / "connect.properties"),
                "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
            },
        )
    try:
        # The worker's venv installs while the server fetches its packages and starts.
        venv = install(wheel, "3.12", tmp_path, extras="[airflow]")
        wait_for_port(port, server, logs)
        # The token is in a file only its owner reads, on no process's command line.
        assert (tmp_path / "connect.properties").stat().st_mode & 0o077 == 0
        shown = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])]
        assert not [c for c in shown if c and token in " ".join(c)]
        home = tmp_path / "airflow"
        (home / "dags").mkdir(parents=True)
        shutil.copy(REPO_ROOT / "dags" / "slicewise_pipelines.py", home / "dags")
        (home / "pipelines.yaml").write_text(
            (REPO_ROOT / "pipelines.yaml")
            .read_text()
            .replace("topic: events", f"topic: {topic}\n    airflow: {{pool: slicewise_spark}}")
        )
        env = {
            "PATH": str(venv / "bin"),  # no java, no spark-submit
            "HOME": str(tmp_path),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps(
                {"conn_type": "spark_connect", "host": "127.0.0.1", "port": port, "password": token}
            ),
            "SLICEWISE_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "SLICEWISE_LAKEHOUSE": str(tmp_path / "lakehouse"),
            "SLICEWISE_GRACE_SECONDS": "0",
        }
        assert shutil.which("java", path=env["PATH"]) is None
        for argv in (
            ["db", "migrate"],
            ["pools", "set", "slicewise_spark", "4", "one Spark Connect server"],  # the README's
            [
                "dags",
                "test",
                "slicewise_events",
                (at + timedelta(hours=1)).replace(minute=0).isoformat(),
            ],
        ):
            done = subprocess.run(
                [str(venv / "bin" / "airflow"), *argv],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        with sqlite3.connect(home / "airflow.db") as db:
            pools = dict(db.execute("SELECT task_id, pool FROM task_instance").fetchall())
        assert {pools[step] for step in ("ingest", "gate", "publish")} == {"slicewise_spark"}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    silver = spark.read.format("delta").load(str(tmp_path / "lakehouse" / "events" / "silver"))
    assert silver.count() == 20
    assert {r.event_date for r in silver.select("event_date").distinct().collect()} == {at.date()}
    gold = spark.read.format("delta").load(
        str(tmp_path / "lakehouse" / "events" / "gold_events_per_hour")
    )
    assert [r.hour for r in gold.select("hour").distinct().collect()] == [
        at.replace(minute=0, tzinfo=None)
    ]


def wait_for_port(port: int, server: subprocess.Popen, logs: Path, timeout: float = 600) -> None:
    """Up once it listens; Ivy fetches the --packages from Maven Central on a first start."""
    deadline = time.monotonic() + timeout
    while not port_open(port):
        assert server.poll() is None, logs.read_text()[-4000:]
        assert time.monotonic() < deadline, logs.read_text()[-4000:]
        time.sleep(1)
