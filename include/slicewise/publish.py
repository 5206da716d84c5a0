"""Publish: rebuild gold (events per hour and type) for the hours a slice may have changed.

Runs only after the gate passed. Gold rows of the affected hours are recomputed
from silver and written with replaceWhere, so publishing a slice again yields
the same rows. The ledger keeps the first publication of each slice; the
Airflow task that announces the silver Asset reads it and announces once.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from slicewise.config import Settings
from slicewise.faults import fault_point
from slicewise.ledger import Ledger
from slicewise.reconcile import parsed_slice
from slicewise.tables import SILVER, read_table, table_exists, table_version
from slicewise.transforms import valid_events

log = logging.getLogger(__name__)


class GateNotPassed(RuntimeError):
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
    parsed = parsed_slice(spark, settings, slice_id)
    events = valid_events(parsed)
    # The hours to rebuild are the whole dedup-horizon window of the slice, not only
    # its own hours: its MERGE may have replaced a stored copy by an earlier-positioned
    # one with another occurred_at, moving that event out of an hour published before.
    # Only rows inside that window can have moved. Hours are UTC strings computed by
    # Spark (session zone UTC): no Python-side time zone conversion.
    hour_fmt = "yyyy-MM-dd HH:mm:ss"
    days = settings.dedup_horizon_days
    span = events.agg(
        F.date_format(F.date_sub(F.min("event_date"), days).cast("timestamp"), hour_fmt).alias(
            "lo"
        ),
        F.date_format(
            F.date_add(F.max("event_date"), days).cast("timestamp") + F.expr("INTERVAL 23 HOURS"),
            hour_fmt,
        ).alias("hi"),
    ).first()
    parsed.unpersist()
    gold_path = settings.table("gold_events_per_hour")
    hours: list[str] = []
    if span is not None and span["lo"] is not None:
        lo, hi = span["lo"], span["hi"]
        hours = [lo, hi]
        silver = read_table(spark, settings.table("silver"), SILVER).where(
            F.col("event_date").between(F.to_date(F.lit(lo)), F.to_date(F.lit(hi)))
        )
        gold = (
            silver.withColumn("hour", F.date_trunc("hour", "occurred_at"))
            .where(F.col("hour").between(F.to_timestamp(F.lit(lo)), F.to_timestamp(F.lit(hi))))
            .groupBy("hour", "event_type")
            .agg(F.count("*").alias("events"))
        )
        (
            gold.write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", f"hour >= '{lo}' AND hour <= '{hi}'")
            .save(gold_path)
        )
    fault_point("publish.gold_written", settings, slice_id)
    publication = Publication(
        slice_id=slice_id,
        silver_version=table_version(spark, settings.table("silver")),
        gold_version=table_version(spark, gold_path) if table_exists(spark, gold_path) else None,
        hours=hours,
    )
    ledger.record_step(slice_id, "publish", asdict(publication))
    log.info("published %s: gold hours %s", slice_id, hours or "none")
    return publication
