"""Example consumer: runs whenever any declared pipeline announces a new silver slice."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, AssetAny, task

from slicewise.assets import silver_asset
from slicewise.pipelines import load_pipelines

with DAG(
    dag_id="slicewise_downstream",
    schedule=AssetAny(*(silver_asset(name) for name in load_pipelines())),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md="Example downstream DAG scheduled on every pipeline's `slicewise_<name>_silver` "
    "Asset; the event's extra carries the pipeline, the slice id, the silver Delta version "
    "and the slice's counts.",
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
                f"{extra.get('pipeline')}: silver slice {extra.get('slice_id')} at Delta version "
                f"{extra.get('silver_version')}"
            )
        return extras

    report()
