"""Silver: each valid event_id once, via an idempotent MERGE bounded by the horizon.

Within the slice the lowest Kafka position survives (`dedup_within`). Across
slices the MERGE replaces a stored copy only by one at a lower position, so
silver ends the same whatever order slices run in and however often. The
MERGE only looks at silver rows whose event_date lies within the dedup horizon
of the slice's own dates: Delta prunes every other partition, so its cost
follows the slice, not the table.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import date, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from slicewise.config import Settings
from slicewise.faults import fault_point
from slicewise.ledger import Ledger
from slicewise.reconcile import SliceCounts, parsed_slice, slice_counts
from slicewise.tables import SILVER, delta_ref, retry_on_conflict, table_exists
from slicewise.transforms import EARLIER_SQL, dedup_within, quarantined, valid_events

log = logging.getLogger(__name__)


@contextmanager
def idempotent_dml(spark: SparkSession, app_id: str) -> Iterator[None]:
    """Delta skips the DML if this app id already committed, and fences racers."""
    spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
    spark.conf.set("spark.databricks.delta.write.txnVersion", "0")
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


def ensure_silver(spark: SparkSession, path: str) -> None:
    if not table_exists(spark, path):
        (
            spark.createDataFrame([], SILVER)
            .write.format("delta")
            .partitionBy("event_date")
            .mode("ignore")
            .save(path)
        )


def horizon_window(events: DataFrame, horizon_days: int) -> tuple[date, date] | None:
    """Event dates the MERGE may touch: the slice's dates widened by the horizon."""
    row = events.agg(F.min("event_date").alias("lo"), F.max("event_date").alias("hi")).first()
    if row is None or row["lo"] is None:
        return None
    return row["lo"] - timedelta(days=horizon_days), row["hi"] + timedelta(days=horizon_days)


def merge_into_silver(
    spark: SparkSession, path: str, events: DataFrame, window: tuple[date, date], app_id: str | None
) -> None:
    """Insert new event_ids; replace a stored copy only by one at a lower position.

    With an `app_id` the MERGE commits at most once for it (and fences racers);
    without, it is still idempotent by content, which quarantine replay relies on.
    """
    lo, hi = window
    ensure_silver(spark, path)
    # SQL rather than DeltaTable.merge: the same statement runs in-process and over
    # Spark Connect, which carries SQL but not Delta's Python API.
    source = f"slice_events_{uuid.uuid4().hex}"
    events.createOrReplaceTempView(source)
    merge = (
        f"MERGE INTO {delta_ref(path)} AS t USING {source} AS s "
        f"ON t.event_date BETWEEN DATE'{lo.isoformat()}' AND DATE'{hi.isoformat()}' "
        "AND t.event_id = s.event_id "
        f"WHEN MATCHED AND ({EARLIER_SQL}) THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *"
    )
    try:
        if app_id is None:
            spark.sql(merge).collect()
        else:
            with idempotent_dml(spark, app_id):
                spark.sql(merge).collect()
    finally:
        spark.catalog.dropTempView(source)


def run_silver(spark: SparkSession, settings: Settings, slice_id: str) -> SliceCounts:
    """Parse the slice's bronze rows, quarantine the bad ones, MERGE the rest."""
    return retry_on_conflict(lambda: _silver(spark, settings, slice_id), f"silver of {slice_id}")


def _silver(spark: SparkSession, settings: Settings, slice_id: str) -> SliceCounts:
    ledger = Ledger(settings.ledger_dir, settings.topic)
    sl = ledger.load_slice(slice_id)
    parsed = parsed_slice(spark, settings, slice_id)

    (
        quarantined(parsed)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", f"slicewise/quarantine/{slice_id}")
        .option("txnVersion", 0)
        .option("userMetadata", json.dumps({"step": "silver", "slice_id": slice_id}))
        .save(settings.table("quarantine"))
    )
    fault_point("silver.quarantined", settings, slice_id)
    events = dedup_within(valid_events(parsed))
    window = horizon_window(events, settings.dedup_horizon_days)
    if window is not None:
        merge_into_silver(
            spark, settings.table("silver"), events, window, f"slicewise/silver/{slice_id}"
        )
    else:
        ensure_silver(spark, settings.table("silver"))
    fault_point("silver.merged", settings, slice_id)

    counts = slice_counts(spark, settings, slice_id, parsed)
    parsed.unpersist()
    ledger.record_step(slice_id, "silver", asdict(counts))
    log.info("silver %s: %s", sl.describe(), counts.describe())
    if not counts.reconciles:
        # The gate owns the verdict (with the offending ids and Data Docs); failing
        # here would only hide that report behind a generic error.
        log.warning(
            "counts of slice %s do not reconcile: %s; the gate will fail",
            slice_id,
            counts.describe(),
        )
    return counts
