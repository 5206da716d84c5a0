"""Production-shaped: the same DAG, by configuration alone, on a real Spark standalone
cluster with Airflow's metadata DB on PostgreSQL, run through the `airflow` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest
from sqlalchemy import create_engine, text
from test_airflow_e2e import end_to_end  # same folder, on sys.path under pytest

from slicewise.airflow_env import VENV_BIN, airflow_env

pytestmark = pytest.mark.integration

DAG_ID = "slicewise_pipeline"
STEPS = ("bronze", "silver", "gate", "publish")


def test_dag_on_a_spark_cluster_with_airflow_on_postgres(
    spark, pipeline, spark_cluster, postgres_url, tmp_path
):
    settings, producer = pipeline
    env = {
        # spark_default names the cluster; nothing else differs from local mode.
        **airflow_env(settings, spark_master=spark_cluster.master_url),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
            {"conn_type": "spark", "host": spark_cluster.master_url}
        ),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_url,
        "SLICEWISE_GRACE_SECONDS": "0",
    }
    airflow(env, "db", "migrate")
    db = create_engine(postgres_url)

    def run_dag(logical_date: datetime) -> dict[str, str]:
        # A run whose gate fails ends the CLI with "DagRun failed": the states tell.
        airflow(env, "dags", "test", DAG_ID, logical_date.isoformat(), ok_if="DagRun failed")
        with db.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT ti.task_id, ti.state FROM task_instance ti JOIN dag_run dr"
                    " ON dr.dag_id = ti.dag_id AND dr.run_id = ti.run_id"
                    " WHERE dr.dag_id = :dag AND dr.logical_date = :at"
                ),
                {"dag": DAG_ID, "at": logical_date},
            ).all()
        return {task_id: str(state) for task_id, state in rows}

    def events_of(slice_id: str) -> list[dict]:
        with db.connect() as conn:
            extras = conn.scalars(text("SELECT extra FROM asset_event")).all()
        extras = [json.loads(e) if isinstance(e, str) else e for e in extras]
        return [
            e for e in extras if (e.get("topic"), e.get("slice_id")) == (settings.topic, slice_id)
        ]

    end_to_end(spark, settings, producer, run_dag, events_of)

    # Every Spark step ran as an application of the cluster, not in a local JVM.
    apps = spark_cluster.completed_apps()
    assert {step for step in STEPS if any(a.startswith(f"slicewise-{step}-") for a in apps)} == set(
        STEPS
    ), apps
    db.dispose()


def test_executors_import_the_drivers_slicewise_from_the_shipped_zip(spark_cluster, tmp_path):
    script = tmp_path / "where.py"
    script.write_text(
        "import json\n"
        "from slicewise.spark import get_spark, ship_package\n"
        "spark = get_spark('slicewise-where')\n"
        "ship_package(spark)\n"
        "rdd = spark.sparkContext.parallelize(range(4), 2)\n"
        "print(json.dumps(sorted(set(rdd.map(lambda _: __import__('slicewise').__file__).collect()))))\n"
    )
    out = subprocess.run(
        [str(VENV_BIN / "spark-submit"), "--master", spark_cluster.master_url, str(script)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    [where] = json.loads(out.stdout.strip().splitlines()[-1])
    # The executors' copy came from the zip Spark fetched, not from this checkout.
    assert "/slicewise-" in where and where.endswith(".zip/slicewise/__init__.py"), where
    assert not where.startswith(str(sys.prefix)), where


def airflow(env: dict[str, str], *args: str, ok_if: str | None = None) -> str:
    out = subprocess.run(
        [str(VENV_BIN / "airflow"), *args], env=env, capture_output=True, text=True, timeout=900
    )
    ok = out.returncode == 0 or (ok_if is not None and out.stderr.strip() == ok_if)
    assert ok, f"airflow {' '.join(args)} failed:\n{out.stderr[-3000:]}"
    return out.stdout
