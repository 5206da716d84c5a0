"""Publish: rebuild gold (events per hour and the definition's `gold.group_by`) for the
hours a slice may have changed; a pipeline without `gold` only records the publication.

Runs only after the gate passed. Gold rows of the affected hours are recomputed
from silver and written with replaceWhere, so publishing a slice again yields
the same rows. The ledger records the latest publication of each slice (for
`slicewise status`), and the pipeline's Kafka consumer group moves to the slice's
upper boundary (slicewise.acknowledge); the Airflow task that announces the silver Asset reads it
and announces a slice once, asking Airflow's own Asset events whether it has.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from pyspark.sql import SparkSession

from slicewise.acknowledge import acknowledge
from slicewise.config import Settings
from slicewise.errors import OperationalError
from slicewise.faults import fault_point
from slicewise.ledger import Ledger
from slicewise.tables import retry_on_conflict, table_exists, table_version
from slicewise.transforms import events_per_hour, window_hours
from slicewise.windows import silver_window, slice_window

log = logging.getLogger(__name__)


class GateNotPassed(OperationalError):
    """Publication was asked for a slice whose gate has not passed."""


@dataclass(frozen=True)
class Publication:
    slice_id: str
    silver_version: int
    gold_version: int | None
    hours: list[str]  # [first, last] hour rebuilt (UTC), or empty


def run_publish(spark: SparkSession, settings: Settings, slice_id: str) -> Publication:
    ledger = Ledger(settings.ledger_dir, settings.topic)
    gate = ledger.step(slice_id, "gate")
    if not gate or not gate.get("success"):
        raise GateNotPassed(
            f"slice {slice_id}: the gate has not passed (ledger: {gate}); run the gate first, "
            "nothing was published."
        )
    # The hours to rebuild are the whole dedup-horizon window of the slice, not only
    # its own hours: its MERGE may have replaced a stored copy by an earlier-positioned
    # one with another occurred_at, moving that event out of an hour published before.
    # Only rows inside that window can have moved.
    window = slice_window(spark, settings, slice_id)
    gold_path = settings.table("gold_events_per_hour")
    gold = settings.pipeline.gold
    hours: list[str] = []
    if window is not None and gold is not None:
        first, last = window_hours(window)
        hours = [first, last]

        def rebuild() -> None:
            (
                events_per_hour(
                    silver_window(spark, settings, window),
                    (first, last),
                    settings.pipeline.column_of(settings.pipeline.event_time),
                    tuple(settings.pipeline.column_of(p) for p in gold.group_by),
                )
                .write.format("delta")
                .mode("overwrite")
                .option("replaceWhere", f"hour >= '{first}' AND hour <= '{last}'")
                .save(gold_path)
            )

        # Two runs publishing at once (a backfill, two at a time) may both create gold, or
        # rewrite overlapping hours: the loser recomputes its hours from silver as it is now.
        retry_on_conflict(rebuild, f"gold of {slice_id}")
    fault_point("publish.gold_written", settings, slice_id)
    publication = Publication(
        slice_id=slice_id,
        silver_version=table_version(spark, settings.table("silver")),
        gold_version=table_version(spark, gold_path) if table_exists(spark, gold_path) else None,
        hours=hours,
    )
    ledger.record_step(slice_id, "publish", asdict(publication))
    log.info("published %s: gold hours %s", slice_id, hours or "none")
    acknowledge(settings, ledger, ledger.load_slice(slice_id))
    return publication
