"""Every DAG imports cleanly, quickly and without I/O, and is set up for safe reruns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta, timezone
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
TWO_PIPELINES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "two-pipelines.yaml"


@pytest.fixture(scope="module")
def dagbag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {
        "slicewise_events",
        "slicewise_events_maintenance",
        "slicewise_downstream",
    }


@pytest.fixture(scope="module")
def two_pipelines_dagbag(airflow_db):
    """The DAGs of the documented two-pipeline file (one DAG per declared pipeline)."""
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLICEWISE_PIPELINES_FILE", str(TWO_PIPELINES))
        return DagBag(dag_folder=str(DAGS))


def test_one_dag_per_declared_pipeline(two_pipelines_dagbag):
    bag = two_pipelines_dagbag
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {
        "slicewise_events",
        "slicewise_orders",
        "slicewise_events_maintenance",
        "slicewise_orders_maintenance",
        "slicewise_downstream",
    }
    orders = bag.get_dag("slicewise_orders")
    assert "orders" in orders.tags and "`tenant`, `order.id`" in orders.doc_md
    argv = orders.get_task("ingest").op_kwargs["argv"]
    assert argv[:2] == ["--pipeline", "orders"]
    [announce] = [t for t in orders.tasks if t.task_id == "announce"]
    assert [a.name for a in announce.outlets] == ["slicewise_orders_silver"]
    # Each pipeline on its own schedule: orders' `schedule: 5m`, events the default hour.
    assert orders.timetable.expression == "*/5 * * * *"
    assert bag.get_dag("slicewise_events").timetable.expression == "0 * * * *"


def test_each_pipeline_has_a_daily_maintenance_dag_of_one_spark_task(two_pipelines_dagbag):
    maintenance = two_pipelines_dagbag.get_dag("slicewise_orders_maintenance")
    assert maintenance.timetable.expression == "0 0 * * *" and maintenance.max_active_runs == 1
    [task] = maintenance.tasks
    assert task.task_id == "maintain" and task.op_kwargs["argv"] == ["--pipeline", "orders"]
    assert "docs/OPERATIONS.md" in maintenance.doc_md


def test_every_spark_attempt_is_stopped_at_the_step_timeout(two_pipelines_dagbag):
    """The span maintenance's VACUUM keeps (SLICEWISE_STEP_TIMEOUT, 2 h by default)."""
    for dag_id in ("slicewise_orders", "slicewise_orders_maintenance"):
        dag = two_pipelines_dagbag.get_dag(dag_id)
        for task_id in ("ingest", "gate", "publish", "maintain"):
            if dag.has_task(task_id):
                assert dag.get_task(task_id).execution_timeout == timedelta(hours=2), task_id


def test_a_broken_definition_file_is_an_import_error_naming_line_and_key(
    airflow_db, tmp_path, monkeypatch
):
    from airflow.dag_processing.dagbag import DagBag

    broken = tmp_path / "pipelines.yaml"
    broken.write_text(TWO_PIPELINES.read_text().replace("key: [tenant, order.id]", "key: []"))
    monkeypatch.setenv("SLICEWISE_PIPELINES_FILE", str(broken))
    bag = DagBag(dag_folder=str(DAGS))
    [error] = [e for f, e in bag.import_errors.items() if f.endswith("slicewise_pipelines.py")]
    assert "pipelines.orders.key: List should have at least 1 item" in error, error


ALL_DAGS = ["slicewise_events", "slicewise_orders", "slicewise_downstream"]


@pytest.mark.parametrize("dag_id", ALL_DAGS)
def test_dag_is_documented_owned_tagged_and_retried(two_pipelines_dagbag, dag_id):
    dag = two_pipelines_dagbag.get_dag(dag_id)
    assert dag.doc_md and "slicewise" in dag.tags
    for t in dag.tasks:
        assert t.owner == "data-platform", t.task_id
        # The gate is the one deliberate exception: its failure is about the data,
        # so it retries once (a crashed driver), not until the alert is hours late.
        assert t.retries >= (1 if t.task_id == "gate" else 2), t.task_id


@pytest.mark.parametrize("dag_id", ["slicewise_events", "slicewise_orders"])
def test_pipeline_order_and_params(two_pipelines_dagbag, dag_id):
    dag = two_pipelines_dagbag.get_dag(dag_id)
    order = ["wait_for_interval_close", "plan", "ingest", "gate", "publish", "announce"]
    for upstream, downstream in zip(order, order[1:], strict=False):
        assert downstream in dag.get_task(upstream).downstream_task_ids
    params = dag.params.dump()
    assert params == {
        "accept_data_loss": False,
        "accept_topic_reset": False,
        "reprocess_from_bronze": False,
    }
    from slicewise.operators import SliceSparkConnectOperator

    for step in ("ingest", "gate", "publish"):
        task = dag.get_task(step)
        assert isinstance(task, SliceSparkConnectOperator), step  # the default mode
        assert (task.conn_id, task.step) == ("spark_connect_default", step)
    from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync

    # Deferrable: no worker slot is held while the interval closes.
    assert isinstance(dag.get_task("wait_for_interval_close"), DateTimeSensorAsync)


@pytest.mark.parametrize("mode", ["connect", "submit"])
def test_the_definition_sets_owner_retries_concurrency_pool_and_connections(
    airflow_db, tmp_path, monkeypatch, mode
):
    """Airflow conventions come from the definition's `airflow:` (defaults: today's)."""
    from airflow.dag_processing.dagbag import DagBag

    conventions = (
        "    airflow: {owner: team-orders, retries: 5, max_active_runs: 2, pool: slicewise_spark,\n"
        "              spark_connect_conn_id: orders_spark, spark_conn_id: orders_submit}\n"
    )
    text = TWO_PIPELINES.read_text().replace(
        "    topic: orders\n", "    topic: orders\n" + conventions
    )
    (tmp_path / "pipelines.yaml").write_text(text)
    monkeypatch.setenv("SLICEWISE_PIPELINES_FILE", str(tmp_path / "pipelines.yaml"))
    monkeypatch.setenv("SLICEWISE_SPARK_MODE", mode)
    bag = DagBag(dag_folder=str(DAGS))
    orders, events = bag.get_dag("slicewise_orders"), bag.get_dag("slicewise_events")
    assert orders.max_active_runs == 2 and events.max_active_runs == 4
    for step in ("ingest", "gate", "publish"):
        mine, default = orders.get_task(step), events.get_task(step)
        assert (mine.owner, mine.pool) == ("team-orders", "slicewise_spark")
        assert (default.owner, default.pool) == ("data-platform", "default_pool")
        assert mine.retries == (1 if step == "gate" else 5)
        conn = mine.conn_id if mode == "connect" else mine._conn_id
        assert conn == ("orders_spark" if mode == "connect" else "orders_submit")
    maintain = bag.get_dag("slicewise_orders_maintenance").get_task("maintain")
    assert (maintain.owner, maintain.pool) == ("team-orders", "slicewise_spark")


def test_a_declared_start_makes_airflow_run_every_interval_from_it(
    airflow_db, tmp_path, monkeypatch
):
    """`start:` turns catchup on from it, so intervals an outage or a pause skipped run
    too; without it Airflow runs the latest interval only (and publication refuses past
    a skipped one: tests/integration/test_coverage.py)."""
    from airflow.dag_processing.dagbag import DagBag

    text = TWO_PIPELINES.read_text().replace(
        "    topic: orders\n", "    topic: orders\n    start: 2026-11-30T06:00:00Z\n"
    )
    (tmp_path / "pipelines.yaml").write_text(text)
    monkeypatch.setenv("SLICEWISE_PIPELINES_FILE", str(tmp_path / "pipelines.yaml"))
    bag = DagBag(dag_folder=str(DAGS))
    orders, events = bag.get_dag("slicewise_orders"), bag.get_dag("slicewise_events")
    assert orders.catchup and orders.start_date.isoformat() == "2026-11-30T06:00:00+00:00"
    assert not events.catchup


def test_the_submit_mode_is_chosen_by_configuration(airflow_db, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from slicewise.operators import SliceSparkSubmitOperator

    monkeypatch.setenv("SLICEWISE_SPARK_MODE", "submit")
    dag = DagBag(dag_folder=str(DAGS)).get_dag("slicewise_events")
    for step in ("ingest", "gate", "publish"):
        task = dag.get_task(step)
        assert isinstance(task, SliceSparkSubmitOperator) and task._conn_id == "spark_default"
        assert task.application.endswith(f"spark_jobs/{step}.py")
        assert os.path.samefile(task.application, REPO / "spark_jobs" / f"{step}.py")

    monkeypatch.setenv("SLICEWISE_SPARK_MODE", "yarn")
    bag = DagBag(dag_folder=str(DAGS))
    [error] = [e for f, e in bag.import_errors.items() if f.endswith("slicewise_pipelines.py")]
    assert "SLICEWISE_SPARK_MODE='yarn'" in error and "connect" in error


def test_parsing_does_no_io_and_no_heavy_imports(tmp_path):
    """Parse the DAG files in a fresh interpreter where sockets and subprocesses fail.

    Airflow and its libraries are imported first (croniter shells out to `file`
    on import); what is checked is the work our DAG files do themselves.
    """
    probe = f"""
import socket, subprocess, sys, runpy
import airflow.sdk, croniter, pendulum
import airflow.providers.apache.spark.operators.spark_submit
import airflow.providers.apache.spark.operators.spark_pyspark
import airflow.providers.standard.sensors.date_time
def refuse(*a, **k): raise AssertionError("I/O while parsing a DAG")
socket.socket.connect = refuse
subprocess.Popen.__init__ = refuse
for f in {sorted(str(p) for p in DAGS.glob("*.py"))!r}:
    runpy.run_path(f)
heavy = [m for m in ("pyspark", "great_expectations", "confluent_kafka", "delta") if m in sys.modules]
assert not heavy, heavy
try:  # the guard itself must bite, or the parse above proved nothing
    socket.socket().connect(("127.0.0.1", 9))
except AssertionError:
    print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_the_interval_sensor_defers_only_while_the_interval_is_open():
    from datetime import datetime, timedelta

    from airflow.sdk.exceptions import TaskDeferred

    from slicewise.operators import IntervalClosedSensor

    now = datetime.now(timezone.utc)
    closed = IntervalClosedSensor(task_id="closed", target_time=now - timedelta(minutes=1))
    assert closed.execute({}) is None  # a backfill: no round trip through the triggerer
    open_ = IntervalClosedSensor(task_id="open", target_time=now + timedelta(hours=1))
    with pytest.raises(TaskDeferred):
        open_.execute({})


def test_an_avro_pipelines_registry_can_come_from_an_airflow_connection(monkeypatch):
    from slicewise.operators import registry_connection_env

    assert registry_connection_env() == {}
    connection = {
        "conn_type": "http",
        "host": "registry.internal",
        "schema": "https",
        "port": 8443,
        "login": "etl",
        "password": "registry-secret",
        "extra": {"path": "/apis/ccompat/v7"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_SCHEMA_REGISTRY", json.dumps(connection))
    monkeypatch.setenv("SLICEWISE_SCHEMA_REGISTRY_CONN_ID", "schema_registry")
    assert registry_connection_env() == {
        "SLICEWISE_SCHEMA_REGISTRY_URL": "https://registry.internal:8443/apis/ccompat/v7",
        "SLICEWISE_SCHEMA_REGISTRY_USER": "etl",
        "SLICEWISE_SCHEMA_REGISTRY_PASSWORD": "registry-secret",
    }
