"""Replay a slice's quarantine after a fix (a parser change, a raised size limit).

Re-parses the slice's bronze rows with today's rules and writes them through
silver's own writes (`silver.write_slice`), replacing the slice's quarantine rows
and ids (`slice_ids`) instead of appending them, quarantine last: a record leaves
quarantine only once silver holds it. The MERGE keeps the copy the survivor rule
prefers, so it is safe to repeat. Run it again if it is interrupted; the counts
reconcile once it completes.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from pyspark.sql import DataFrame, SparkSession

from slicewise.bronze import require_bronze_rows
from slicewise.config import Settings
from slicewise.gate_facts import SliceCounts, slice_counts
from slicewise.ledger import Ledger
from slicewise.silver import parsed_slice, write_slice
from slicewise.tables import replace_slice

log = logging.getLogger(__name__)


def run_replay(spark: SparkSession, settings: Settings, slice_id: str) -> SliceCounts:
    ledger = Ledger(settings.ledger_dir, settings.topic)
    ledger.load_slice(slice_id)  # fails clearly if the slice is unknown
    require_bronze_rows(ledger, slice_id)

    def replace(rows: DataFrame, table: str) -> None:
        replace_slice(rows, settings.table(table), slice_id)

    # No idempotent-write id for the MERGE: the slice's id was spent by its first
    # MERGE, and this one is idempotent by content (the survivor rule).
    parsed = parsed_slice(spark, settings, slice_id)
    write_slice(spark, settings, slice_id, parsed, replace, merge_id=None, quarantine_last=True)
    counts = slice_counts(spark, settings, slice_id)
    ledger.record_step(slice_id, "replay", asdict(counts))
    log.info("replayed quarantine of %s: %s", slice_id, counts.describe())
    return counts
