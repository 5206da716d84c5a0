"""The baselines as teams schedule them: a DAG each (`bench_w1`, `bench_w1plus`) whose one
task spark-submits W1's or W1+'s AvailableNow job (`bench/w1_job.py`) on
`spark_default`, for `make bench`'s "W1 via Airflow" and "W1+ via Airflow"."""

from __future__ import annotations

import os

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG

from slicewise.spark import local_conf, static_conf

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spark_jars() -> str:
    from slicewise.spark import jars_arg

    return jars_arg()


for workload in ("w1", "w1plus"):
    with DAG(
        dag_id=f"bench_{workload}",
        schedule="0 * * * *",
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        doc_md=__doc__,
        tags=["bench"],
        user_defined_macros={"bench_spark_jars": _spark_jars},
    ):
        SparkSubmitOperator(
            task_id=workload,
            conn_id="spark_default",
            application=os.path.join(BENCH, "w1_job.py"),
            application_args=[
                "--workload",
                workload,
                "--root",
                "{{ var.value.get('bench_w1_root', '/tmp') }}/{{ ts_nodash }}",
            ],
            # The same settings as the workload's process in the bench (workloads `session`).
            conf={
                **static_conf(),
                **local_conf(),
                "spark.driver.memory": "4g",
                "spark.jars": "{{ bench_spark_jars() }}",
            },
            name=f"bench-{workload}",
        )
