"""Example consumer: runs whenever the pipeline announces a new silver slice."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from slicewise.assets import SILVER

with DAG(
    dag_id="slicewise_downstream",
    schedule=[SILVER],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md="Example downstream DAG scheduled on the `slicewise_silver` Asset; "
    "the event's extra carries the slice id, the silver Delta version and the slice's counts.",
    tags=["slicewise", "example"],
    default_args={"owner": "data-platform", "retries": 2},
) as dag:

    @task
    def report(triggering_asset_events=None) -> list[dict]:
        extras = [
            dict(e.extra) for events in (triggering_asset_events or {}).values() for e in events
        ]
        # The pipeline announces no empty slice; an event without rows (from another
        # producer of the Asset, or an older version) has nothing for us either.
        extras = [x for x in extras if (x.get("counts") or {}).get("read") != 0]
        for extra in extras:
            print(
                f"silver slice {extra.get('slice_id')} at Delta version {extra.get('silver_version')}"
            )
        return extras

    report()
