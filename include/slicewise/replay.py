"""Replay a slice's quarantine after a fix (a parser change, a raised size limit).

Re-parses the slice's bronze rows with today's rules, rewrites the slice's ids
(`slice_ids`) to its now-valid events, MERGEs them into silver (the MERGE keeps
the lowest position, so this is safe to repeat), then rewrites the slice's
quarantine rows to what is still invalid.
Run it again if it is interrupted; the counts reconcile once it completes.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from pyspark.sql import DataFrame, SparkSession

from slicewise.bronze import require_bronze_rows
from slicewise.config import Settings
from slicewise.ledger import Ledger
from slicewise.reconcile import SliceCounts, slice_counts
from slicewise.silver import merge_survivors, parsed_slice
from slicewise.transforms import quarantined, slice_ids, survivors, valid_events

log = logging.getLogger(__name__)


def run_replay(spark: SparkSession, settings: Settings, slice_id: str) -> SliceCounts:
    ledger = Ledger(settings.ledger_dir, settings.topic)
    ledger.load_slice(slice_id)  # fails clearly if the slice is unknown
    require_bronze_rows(ledger, slice_id)
    pipeline = settings.pipeline
    parsed = parsed_slice(spark, settings, slice_id)
    try:
        kept = survivors(valid_events(parsed, pipeline), pipeline)
        replace_slice(slice_ids(kept, pipeline), settings.table("slice_ids"), slice_id)
        # Silver's own MERGE, without an idempotent-write id: the slice's id was spent
        # by its first MERGE, and this one is idempotent by content (the survivor rule).
        merge_survivors(spark, settings, kept, app_id=None)
        replace_slice(quarantined(parsed), settings.table("quarantine"), slice_id)
    finally:
        parsed.unpersist()
    counts = slice_counts(spark, settings, slice_id)
    ledger.record_step(slice_id, "replay", asdict(counts))
    log.info("replayed quarantine of %s: %s", slice_id, counts.describe())
    return counts


def replace_slice(df: DataFrame, path: str, slice_id: str) -> None:
    """The slice's rows of a table become `df`'s (other slices' rows untouched)."""
    (
        df.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"slice_id = '{slice_id}'")
        .save(path)
    )
