"""Replay a slice's quarantine after a fix (a parser change, a raised size limit).

Re-parses the slice's bronze rows with today's rules, MERGEs the now-valid
events into silver (the MERGE keeps the lowest position, so this is safe to
repeat), then rewrites the slice's quarantine rows to what is still invalid.
Run it again if it is interrupted; the counts reconcile once it completes.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from pyspark.sql import SparkSession

from slicewise.config import Settings
from slicewise.ledger import Ledger
from slicewise.reconcile import SliceCounts, parsed_slice, slice_counts
from slicewise.silver import horizon_window, merge_into_silver
from slicewise.transforms import dedup_within, quarantined, valid_events

log = logging.getLogger(__name__)


def run_replay(spark: SparkSession, settings: Settings, slice_id: str) -> SliceCounts:
    ledger = Ledger(settings.ledger_dir, settings.topic)
    ledger.load_slice(slice_id)  # fails clearly if the slice is unknown
    parsed = parsed_slice(spark, settings, slice_id)
    events = dedup_within(valid_events(parsed))
    window = horizon_window(events, settings.dedup_horizon_days)
    if window is not None:
        merge_into_silver(spark, settings.table("silver"), events, window, app_id=None)
    (
        quarantined(parsed)
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"slice_id = '{slice_id}'")
        .save(settings.table("quarantine"))
    )
    counts = slice_counts(spark, settings, slice_id, parsed)
    parsed.unpersist()
    ledger.record_step(slice_id, "replay", asdict(counts))
    log.info("replayed quarantine of %s: %s", slice_id, counts.describe())
    return counts
