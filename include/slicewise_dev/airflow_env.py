"""The environment an embedded Airflow runs in: SQLite, our dags/, local Spark.

Used by the demo, the tests and `make airflow-ui`, so all three see the same
metadata DB, connection and lakehouse.

    python -m slicewise_dev.airflow_env standalone   # the Airflow UI on :8080
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from slicewise.config import REPO_ROOT, Settings, load_settings

VENV_BIN = Path(sys.executable).parent


def airflow_env(settings: Settings, spark_master: str = "local[*]") -> dict[str, str]:
    """`spark_master` is for the spark-submit mode; the Spark Connect mode (the default)
    uses the server of SLICEWISE_SPARK_REMOTE, or the embedded one (`make spark-connect`)."""
    from slicewise.connect_server import connect_connection, embedded

    home = settings.state_dir / "airflow"
    remote = settings.spark_remote or embedded(settings).url
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # The scheduler, triggerer and api-server share one SQLite file: wait for its lock
        # (up to 60 s) instead of failing at once with "database is locked".
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": os.environ.get(
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{home}/airflow.db?timeout=60"
        ),
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # spark-submit (from the pyspark wheel) must be on the task's PATH.
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SLICEWISE_STATE_DIR": str(settings.state_dir),
        "SLICEWISE_LAKEHOUSE": settings.lakehouse,
        "SLICEWISE_TOPIC": settings.topic,
        "SLICEWISE_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "SLICEWISE_CACHE_DIR": str(settings.cache_dir),
        "SLICEWISE_SPARK_REMOTE": remote,
        "PYARROW_IGNORE_TIMEZONE": "1",
    }
    env.setdefault(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": spark_master})
    )
    env.setdefault("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", connect_connection(remote))
    return env


def migrate(env: dict[str, str]) -> None:
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(VENV_BIN / "airflow"), "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL
    )


def main(argv: list[str]) -> int:
    env = airflow_env(load_settings())
    migrate(env)
    print(
        f"AIRFLOW_HOME={env['AIRFLOW_HOME']}; the admin password is printed below and kept in "
        f"{env['AIRFLOW_HOME']}/simple_auth_manager_passwords.json.generated"
    )
    os.execve(str(VENV_BIN / "airflow"), ["airflow", *argv], env)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:] or ["standalone"]))
