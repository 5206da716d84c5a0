"""Kafka -> ingest (bronze + silver) -> gate -> publish, one frozen slice per data interval:
one DAG, `slicewise_<name>`, per pipeline declared in pipelines.yaml, and beside it
`slicewise_<name>_maintenance`, which keeps the pipeline's tables compact and vacuumed.

This file only wires tasks. Its one read is the definition file (small, local, cached
by modification time), as any config-driven DAG file does; no heavy imports, no
network at parse time.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pendulum
from airflow.sdk import DAG, BaseOperator, CronDataIntervalTimetable, Param, task

from slicewise.assets import silver_asset
from slicewise.config import grace_seconds, schedule, spark_mode, step_timeout
from slicewise.operators import (
    IntervalClosedSensor,
    SliceSparkConnectOperator,
    SliceSparkSubmitOperator,
    application,
)
from slicewise.pipelines import Pipeline, load_pipelines
from slicewise.spark import static_conf

SLICE_ID = "{{ ti.xcom_pull(task_ids='plan') }}"


def _spark_jars() -> str:
    """Resolved when the task runs (a template macro), never while the DAG is parsed."""
    from slicewise.spark import jars_arg

    return jars_arg()


def spark_step(pipeline: Pipeline, step: str, extra_args: list[str] | None = None) -> BaseOperator:
    """A Spark step of the run's slice."""
    return spark_task(pipeline, step, ["--slice-id", SLICE_ID, *(extra_args or [])])


def spark_task(pipeline: Pipeline, step: str, args: list[str]) -> BaseOperator:
    """A Spark task: a client of the Spark Connect server (the definition's
    `airflow.spark_connect_conn_id`), or a spark-submit application (`spark_conn_id`:
    local[*], a cluster, YARN, Kubernetes), in the definition's pool. Only the
    connections say where; the steps and their arguments are the same. Airflow stops an
    attempt after SLICEWISE_STEP_TIMEOUT, the span maintenance's VACUUM keeps."""
    argv = ["--pipeline", pipeline.name, *args]
    conventions = pipeline.airflow
    if spark_mode() == "connect":
        return SliceSparkConnectOperator(
            task_id=step,
            step=step,
            argv=argv,
            conn_id=conventions.spark_connect_conn_id,
            pool=conventions.pool,
            execution_timeout=step_timeout(),
        )
    return SliceSparkSubmitOperator(
        task_id=step,
        conn_id=conventions.spark_conn_id,
        application=application(step),
        application_args=argv,
        conf={**static_conf(), "spark.jars": "{{ slicewise_spark_jars() }}"},
        name=f"slicewise-{pipeline.name}-{step}-{{{{ data_interval_start | ts_nodash }}}}",
        pool=conventions.pool,
        execution_timeout=step_timeout(),
    )


DOC = """
### slicewise: exactly-once Kafka → Delta, pipeline `{name}`

{description}

Topic `{topic}`, deduplicated on ({key}), event time `{event_time}`; declared in
pipelines.yaml (docs/PIPELINES.md).

Each run owns one **slice**: for every partition, the offsets between the
boundaries of its data interval. Boundaries are resolved once (capped at the
last stable offset, so no open transaction is cut) and stored in the offset
ledger; retries, cleared tasks and backfills read exactly the same offsets.

1. `wait_for_interval_close` – deferrable; waits for interval end + grace.
2. `plan` – freezes the slice in the ledger.
3. `ingest` – Spark reads the slice once (read_committed): bronze, exactly
   once, and from the same rows silver (parse, quarantine bad records, dedup,
   MERGE on the key).
4. `gate` – Great Expectations; a failure stops the run before publication.
5. `publish` – rebuild gold for the hours touched; `announce` emits the
   `{asset}` Asset event once per slice.

Every task is safe to clear and re-run. Params: `accept_data_loss` (after a
data-loss report, ingest what Kafka still retains; logged), `accept_topic_reset`
(after a topic-reset report, read the topic as it is now from its start; logged), and
`reprocess_from_bronze` (re-parse the slice's bronze rows with today's rules,
e.g. after a parser fix; replays its quarantine). See docs/RUNBOOK.md.
"""


def pipeline_dag(pipeline: Pipeline) -> DAG:
    """The DAG of one declared pipeline."""
    silver_events = silver_asset(pipeline.name)
    doc = DOC.format(
        name=pipeline.name,
        description=pipeline.description,
        topic=pipeline.topic,
        key=", ".join(f"`{k}`" for k in pipeline.key),
        event_time=pipeline.event_time,
        asset=silver_events.name,
    )
    with DAG(
        dag_id=pipeline.dag_id,
        schedule=CronDataIntervalTimetable(pipeline.schedule or schedule(), timezone="UTC"),
        # With a declared start, Airflow runs every interval from it (the ones an outage
        # or a pause skipped too); without one, publication refuses past a skipped one.
        start_date=pendulum.instance(pipeline.start or datetime(2026, 1, 1, tzinfo=timezone.utc)),
        catchup=pipeline.start is not None,
        max_active_runs=pipeline.airflow.max_active_runs,
        doc_md=doc,
        tags=["slicewise", "kafka", "delta", pipeline.name],
        user_defined_macros={"slicewise_spark_jars": _spark_jars},
        default_args={
            "owner": pipeline.airflow.owner,
            "retries": pipeline.airflow.retries,
            "retry_delay": timedelta(seconds=30),
            "retry_exponential_backoff": True,
            "max_retry_delay": timedelta(minutes=10),
        },
        params={
            "accept_data_loss": Param(
                False,
                type="boolean",
                title="Accept data loss",
                description="Only after a DATA LOSS report: ingest what Kafka still retains. Logged in the ledger.",
            ),
            "accept_topic_reset": Param(
                False,
                type="boolean",
                title="Accept topic reset",
                description="Only after a TOPIC RESET report (the topic was recreated or its offsets went back): read it as it is now from its start. Recorded in the ledger.",
            ),
            "reprocess_from_bronze": Param(
                False,
                type="boolean",
                title="Reprocess from bronze",
                description="Re-parse this slice's bronze rows (e.g. after a parser fix) instead of the normal ingest step.",
            ),
        },
    ) as dag:
        wait = IntervalClosedSensor(
            task_id="wait_for_interval_close",
            target_time="{{ data_interval_end + macros.timedelta(seconds="
            + str(grace_seconds())
            + ") }}",
        )

        @task
        def plan(data_interval_start=None, data_interval_end=None, params=None) -> str:
            from slicewise.operators import task_settings
            from slicewise.planner import plan_slice

            sl = plan_slice(
                task_settings(pipeline.name),
                data_interval_start,
                data_interval_end,
                accept_data_loss=bool(params["accept_data_loss"]),
                accept_topic_reset=bool(params["accept_topic_reset"]),
            )
            print(sl.describe())
            return sl.slice_id

        @task(inlets=[silver_events], outlets=[silver_events])
        def announce(
            slice_id: str, data_interval_end=None, inlet_events=None, outlet_events=None
        ) -> None:
            """Emit the silver Asset event once per slice; a re-run is skipped."""
            from slicewise.assets import announce as announce_slice

            announce_slice(pipeline.name, slice_id, data_interval_end, inlet_events, outlet_events)

        planned = plan()
        ingest = spark_step(
            pipeline,
            "ingest",
            [
                "--accept-data-loss",
                "{{ params.accept_data_loss | lower }}",
                "--reprocess-from-bronze",
                "{{ params.reprocess_from_bronze | lower }}",
            ],
        )
        gate = spark_step(pipeline, "gate")
        # A failed gate is a finding about the data, not a transient error: one retry
        # covers a crashed driver, more would only delay the alert. On-call clears the
        # task once the cause is fixed.
        gate.retries = min(1, pipeline.airflow.retries)
        publish = spark_step(pipeline, "publish")
        wait >> planned >> ingest >> gate >> publish >> announce(planned)
    return dag


MAINTENANCE_DOC = """
### slicewise: maintenance of pipeline `{name}`

Compacts bronze, quarantine, `slice_ids`, gold and silver's settled event dates,
purges silver's deletion vectors there, drops bronze rows past
`maintenance.bronze_retain` (published slices only; off by default), and VACUUMs
every table with `maintenance.vacuum_retain` ({retain}). It runs beside live
slices: a commit conflict is retried by whichever side lost. Safe to clear and
re-run at any time. See docs/OPERATIONS.md.
"""


def maintenance_dag(pipeline: Pipeline) -> DAG:
    """The maintenance DAG of one declared pipeline: one Spark task."""
    with DAG(
        dag_id=pipeline.maintenance_dag_id,
        schedule=CronDataIntervalTimetable(pipeline.maintenance.schedule, timezone="UTC"),
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        doc_md=MAINTENANCE_DOC.format(
            name=pipeline.name, retain=pipeline.maintenance.vacuum_retain
        ),
        tags=["slicewise", "maintenance", pipeline.name],
        user_defined_macros={"slicewise_spark_jars": _spark_jars},
        default_args={
            "owner": pipeline.airflow.owner,
            "retries": min(2, pipeline.airflow.retries),
            "retry_delay": timedelta(minutes=5),
        },
    ) as dag:
        spark_task(pipeline, "maintain", [])
    return dag


for _pipeline in load_pipelines().values():
    globals()[_pipeline.dag_id] = pipeline_dag(_pipeline)
    globals()[_pipeline.maintenance_dag_id] = maintenance_dag(_pipeline)
