"""The environment an embedded Airflow runs in: SQLite, our dags/, local Spark.

Used by the demo, the tests and `make airflow-ui`, so all three see the same
metadata DB, connection and lakehouse.

    python -m slicewise_dev.airflow_env standalone   # the Airflow UI on :8080, until Ctrl-C
    python -m slicewise_dev.airflow_env stop         # stop it from another shell

`airflow standalone` runs the scheduler, dag-processor, triggerer, api-server and
the executor's workers as its children; on SIGTERM it leaves them running. So it
runs in a process group of its own, and Ctrl-C (or `stop`) ends that whole group
and every descendant, with a pid file so that `stop` finds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from slicewise.config import Settings, load_settings
from slicewise.errors import ConfigError
from slicewise.home import REPO_ROOT
from slicewise.pipelines import definitions_file, load_pipelines
from slicewise_dev.process import end_tree

VENV_BIN = Path(sys.executable).parent


def airflow_env(
    settings: Settings,
    spark_master: str = "local[*]",
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of Airflow and its tasks: `environ` (default: this process's) with
    the settings' state, lakehouse, broker and Spark Connect server.

    Every pipeline of the definition file is a DAG of this Airflow, and each task reads
    its own pipeline's topic from the file: SLICEWISE_TOPIC is set only when `settings`
    override the topic of a file with one pipeline (a test's own topic).

    `spark_master` is for the spark-submit mode; the Spark Connect mode (the default)
    uses the server of SLICEWISE_SPARK_REMOTE, or the embedded one (`make spark-connect`)."""
    from slicewise.connect_server import connect_connection, embedded

    home = settings.state_dir / "airflow"
    server = None if settings.spark_remote else embedded(settings)
    remote = settings.spark_remote or server.url
    token = settings.spark_token or (server.token if server else None)
    environ = os.environ if environ is None else environ
    env = {
        **{name: value for name, value in environ.items() if name != "SLICEWISE_TOPIC"},
        **topic_override(settings, environ),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # The scheduler, triggerer and api-server share one SQLite file: wait for its lock
        # (up to 60 s) instead of failing at once with "database is locked".
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": environ.get(
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{home}/airflow.db?timeout=60"
        ),
        "AIRFLOW__CORE__PARALLELISM": "2",
        # A task's supervisor waits on its sockets for up to this long between checks, and
        # often sees the task's exit only at the next one: with the default 5 s each task
        # kept its worker ~2.5 s longer on average (5 s tails seen with py-spy). 1 s costs a
        # heartbeat per running task per second.
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # A laptop's UI and execution API, not the network's (the default binds 0.0.0.0).
        "AIRFLOW__API__HOST": "127.0.0.1",
        # spark-submit (from the pyspark wheel) must be on the task's PATH.
        "PATH": f"{VENV_BIN}{os.pathsep}{environ.get('PATH', '')}",
        "SLICEWISE_STATE_DIR": str(settings.state_dir),
        "SLICEWISE_LAKEHOUSE": settings.lakehouse,
        "SLICEWISE_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "SLICEWISE_CACHE_DIR": str(settings.cache_dir),
        "SLICEWISE_SPARK_REMOTE": remote,
        "PYARROW_IGNORE_TIMEZONE": "1",
    }
    env.setdefault(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": spark_master})
    )
    env.setdefault("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", connect_connection(remote, token))
    return env


def topic_override(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """SLICEWISE_TOPIC for the tasks, only if `settings` read another topic than their
    pipeline's `topic:` (a test's own topic). It holds for every pipeline of the file
    (`load_settings` refuses it in a file of two or more), so the topic of the pipeline
    `settings` were loaded for, the file's first, is never passed on by itself."""
    if settings.topic == settings.pipeline.topic:
        return {}
    path = definitions_file(environ)
    if len(load_pipelines(path)) > 1:
        raise ConfigError(
            f"pipeline {settings.pipeline.name!r} reads topic {settings.topic!r}, not its "
            f"`topic:` {settings.pipeline.topic!r}, and {path} has more than one pipeline: "
            "SLICEWISE_TOPIC would send them all to that topic; set each pipeline's `topic:` "
            "in the file instead."
        )
    return {"SLICEWISE_TOPIC": settings.topic}


def ui_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What `make airflow-ui` (and `make airflow-ui-stop`) run Airflow with: the
    environment's settings, for every pipeline of its definition file."""
    environ = os.environ if environ is None else environ
    return airflow_env(load_settings(environ), environ=environ)


PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"


def migrate(env: dict[str, str]) -> None:
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    # The admin password Airflow generates lands in this file, which it opens for
    # appending: created here first, it keeps its owner-only mode.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(home / PASSWORDS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    subprocess.run(
        [str(VENV_BIN / "airflow"), "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL
    )


def pid_file(env: dict[str, str]) -> Path:
    return Path(env["AIRFLOW_HOME"]) / "standalone.pid"


def standalone(env: dict[str, str]) -> int:
    """`airflow standalone` until Ctrl-C or SIGTERM, then nothing it started is left."""
    proc = subprocess.Popen(
        [str(VENV_BIN / "airflow"), "standalone"], env=env, start_new_session=True
    )
    pid_file(env).write_text(f"{os.getpid()}\n")
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            print(f"\nstopping Airflow ({signal.Signals(signum).name})", flush=True)
            end_tree(proc.pid)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        code = proc.wait()
        end_tree(proc.pid)  # a child may outlive standalone if it died on its own
    finally:
        pid_file(env).unlink(missing_ok=True)
    return 0 if stopping else code


def running(pid: int) -> bool:
    """`pid` has not exited: a zombie has, though its parent has yet to reap it (the
    parent of `standalone` may be a shell or a test busy elsewhere, and waiting on a
    zombie took this stop its full timeout and end_tree's grace, 95 s, every time)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop(env: dict[str, str], timeout: float = 60.0) -> int:
    """Stop a `standalone` started from another shell (what `make airflow-ui-stop` runs)."""
    path = pid_file(env)
    if not path.exists():
        print("Airflow (make airflow-ui) is not running")
        return 0
    pid = int(path.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)  # its handler ends the whole tree
    deadline = time.monotonic() + timeout
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if running(pid):
        end_tree(pid)
    path.unlink(missing_ok=True)
    print(f"Airflow stopped (was pid {pid})")
    return 0


def main(argv: list[str]) -> int:
    env = ui_env()
    if argv == ["stop"]:
        return stop(env)
    migrate(env)
    print(
        f"AIRFLOW_HOME={env['AIRFLOW_HOME']}; the admin password is printed below and kept in "
        f"{env['AIRFLOW_HOME']}/{PASSWORDS_FILE}; Ctrl-C stops it all",
        flush=True,
    )
    return standalone(env)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:] or ["standalone"]))
