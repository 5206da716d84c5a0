"""Per-slice counts, computed from the tables themselves.

read = quarantined + duplicates_in_slice + inserted + duplicates_in_silver,
and no valid event_id of the slice may be missing from silver. Computing this
from bronze, quarantine, the slice's ids and (the horizon window of) silver,
rather than from a MERGE's metrics, gives the same answer on every rerun and in
any order. No parse: silver keeps the slice's ids (`transforms.slice_ids`), so
silver and the gate count with the same query.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from slicewise.config import Settings
from slicewise.tables import BRONZE, QUARANTINE, SILVER, SLICE_IDS, of_slice, read_table
from slicewise.transforms import event_date_span, horizon_window


@dataclass(frozen=True)
class SliceCounts:
    slice_id: str
    read: int
    quarantined: int
    duplicates_in_slice: int
    inserted: int  # silver rows whose surviving copy came from this slice
    duplicates_in_silver: int  # valid ids whose surviving copy is in another slice
    missing: int  # valid ids found nowhere in silver: must be 0

    @property
    def accounted(self) -> int:
        return (
            self.quarantined + self.duplicates_in_slice + self.inserted + self.duplicates_in_silver
        )

    @property
    def reconciles(self) -> bool:
        return self.read == self.accounted and self.missing == 0

    def describe(self) -> str:
        return (
            f"read={self.read} quarantined={self.quarantined} dup_in_slice={self.duplicates_in_slice} "
            f"inserted={self.inserted} dup_in_silver={self.duplicates_in_silver} missing={self.missing}"
            f" -> {'reconciled' if self.reconciles else 'NOT RECONCILED'}"
        )


def recorded_ids(spark: SparkSession, settings: Settings, slice_id: str) -> DataFrame:
    return of_slice(spark, settings.table("slice_ids"), SLICE_IDS, slice_id)


def slice_window(
    spark: SparkSession, settings: Settings, slice_id: str
) -> tuple[date, date] | None:
    """Event dates the slice's MERGE may touch (its dates widened by the dedup horizon),
    or None when it has no valid event."""
    span = event_date_span(recorded_ids(spark, settings, slice_id)).first()
    if span is None or span["first"] is None:
        return None
    return horizon_window(span["first"], span["last"], settings.dedup_horizon_days)


def silver_window(
    spark: SparkSession, settings: Settings, window: tuple[date, date] | None
) -> DataFrame:
    """Silver rows within a window of event dates (partition-pruned)."""
    silver = read_table(spark, settings.table("silver"), SILVER)
    if window is None:
        return silver.limit(0)
    lo, hi = window
    return silver.where(F.col("event_date").between(F.lit(lo), F.lit(hi)))


def slice_counts(
    spark: SparkSession, settings: Settings, slice_id: str, window: tuple[date, date] | None
) -> SliceCounts:
    """The slice's counts in one query over bronze, quarantine, its ids and silver's window."""
    ids = recorded_ids(spark, settings, slice_id)
    stored = silver_window(spark, settings, window).select(
        "event_id", F.col("slice_id").alias("owner")
    )
    owner = F.col("owner")
    facts = ids.join(stored, "event_id", "left").agg(
        F.coalesce(F.sum("copies"), F.lit(0)).alias("valid"),
        F.count("event_id").alias("distinct_ids"),
        F.count_if(owner == slice_id).alias("inserted"),
        F.count_if(owner.isNotNull() & (owner != slice_id)).alias("elsewhere"),
        F.count_if(owner.isNull()).alias("missing"),
    )
    read = of_slice(spark, settings.table("bronze"), BRONZE, slice_id).agg(
        F.count("*").alias("read")
    )
    quarantined = of_slice(spark, settings.table("quarantine"), QUARANTINE, slice_id).agg(
        F.count("*").alias("quarantined")
    )
    row = facts.crossJoin(read).crossJoin(quarantined).first()
    return SliceCounts(
        slice_id=slice_id,
        read=int(row["read"]),
        quarantined=int(row["quarantined"]),
        duplicates_in_slice=int(row["valid"]) - int(row["distinct_ids"]),
        inserted=int(row["inserted"]),
        duplicates_in_silver=int(row["elsewhere"]),
        missing=int(row["missing"]),
    )
