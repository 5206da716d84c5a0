"""Ingest: bronze and silver of a slice from one read of Kafka (the DAG's step).

The slice's records are read once (read_committed), parsed and kept on disk; bronze
is appended from the kept rows (raw, with the slice's offsets in the same commit),
and silver's quarantine, `slice_ids` and MERGE are written from the same rows.
What keeps this exactly-once is that every write has its own idempotent-write id,
not the step: a retry of the whole step, or `silver` run alone, ends in the same
tables. When bronze already holds the slice (a retry after bronze committed, a
`bronze` run by hand, a racing attempt that won bronze), silver reads bronze and
never Kafka, which may have deleted the records since.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.storagelevel import StorageLevel

from slicewise.bronze import (
    BronzeResult,
    commit_bronze,
    read_slice,
    readable_ranges,
    stored_slice,
)
from slicewise.config import Settings
from slicewise.ledger import Ledger
from slicewise.schemas import BRONZE
from slicewise.silver import SilverResult, merge_slice, parse, parsed_slice
from slicewise.tables import conform, retry_on_conflict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestResult:
    bronze: BronzeResult
    silver: SilverResult


def run_ingest(
    spark: SparkSession, settings: Settings, slice_id: str, accept_data_loss: bool = False
) -> IngestResult:
    """Bronze and silver of one planned slice, exactly once, from one Kafka read."""
    return retry_on_conflict(
        lambda: _ingest(spark, settings, slice_id, accept_data_loss), f"ingest of {slice_id}"
    )


def _ingest(
    spark: SparkSession, settings: Settings, slice_id: str, accept_data_loss: bool
) -> IngestResult:
    ledger = Ledger.of(settings)
    sl = ledger.load_slice(slice_id)
    readable = readable_ranges(spark, settings, ledger, sl, accept_data_loss)
    if readable is None:  # Kafka no longer holds the slice; bronze does
        return IngestResult(
            stored_slice(spark, settings, ledger, sl),
            merge_slice(spark, settings, ledger, sl, parsed_slice(spark, settings, slice_id)),
        )
    ranges, metadata = readable
    # Parsed before bronze's write, and kept: the write materialises them, so the
    # records cross from Kafka once and are parsed once; bronze takes its raw columns
    # back out of the parsed rows, which keep them for quarantine anyway. Kept on disk,
    # not in memory: they are read twice more (silver's writes), and held in memory they
    # raised a 2 M-record slice's peak by ~0.5 GiB at no gain in time
    # (bench/results/NOTES.md).
    parsed = parse(read_slice(spark, settings, sl, ranges), settings).persist(
        StorageLevel.DISK_ONLY
    )
    try:
        bronze = commit_bronze(spark, settings, ledger, sl, conform(parsed, BRONZE), metadata)
        if not bronze.committed:
            # An earlier or racing attempt's commit holds the slice, and Delta skipped
            # this write before reading anything: silver reads what that commit holds.
            parsed.unpersist()
            parsed = parsed_slice(spark, settings, slice_id)
        silver = merge_slice(spark, settings, ledger, sl, parsed)
    finally:
        parsed.unpersist()
    log.info("ingested %s: %d rows into bronze, then silver", sl.describe(), bronze.rows)
    return IngestResult(bronze, silver)
