"""Per-slice counts, computed from the tables themselves.

read = quarantined + duplicates_in_slice + inserted + duplicates_in_silver,
and no valid event_id of the slice may be missing from silver. Computing this
from bronze, quarantine and (the horizon window of) silver, rather than from a
MERGE's metrics, gives the same answer on every rerun and in any order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from slicewise.config import Settings
from slicewise.tables import BRONZE, QUARANTINE, SILVER, read_table
from slicewise.transforms import parse_events, valid_events


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


def silver_window(
    spark: SparkSession, settings: Settings, dates: tuple[date, date] | None
) -> DataFrame:
    """Silver rows within the horizon of the slice's event dates (partition-pruned)."""
    silver = read_table(spark, settings.table("silver"), SILVER)
    if dates is None:
        return silver.limit(0)
    lo, hi = dates
    return silver.where(F.col("event_date").between(F.lit(lo), F.lit(hi)))


def parsed_slice(spark: SparkSession, settings: Settings, slice_id: str) -> DataFrame:
    """The slice's bronze rows, parsed once and cached; the caller unpersists.

    Every step filters them (valid, quarantined) several times. Uncached, Spark
    pushes each filter on `reason` below the parse and evaluates it inline, which
    costs several parses per row (see `parse_events`).
    """
    bronze = read_table(spark, settings.table("bronze"), BRONZE).where(
        F.col("slice_id") == slice_id
    )
    return parse_events(bronze, settings.max_value_bytes).cache()


def slice_counts(
    spark: SparkSession, settings: Settings, slice_id: str, parsed: DataFrame
) -> SliceCounts:
    """Counts from the tables; `parsed` is the calling step's `parsed_slice`."""
    from slicewise.silver import horizon_window  # circular at import time otherwise

    quarantine = read_table(spark, settings.table("quarantine"), QUARANTINE).where(
        F.col("slice_id") == slice_id
    )
    valid = valid_events(parsed)
    window = silver_window(spark, settings, horizon_window(valid, settings.dedup_horizon_days))

    ids = valid.groupBy("event_id").count()
    stored = window.select("event_id", F.col("slice_id").alias("owner"))
    joined = ids.join(stored, "event_id", "left")
    agg = joined.agg(
        F.coalesce(F.sum("count"), F.lit(0)).alias("valid"),
        F.count("*").alias("distinct_ids"),
        F.sum(F.when(F.col("owner") == slice_id, 1).otherwise(0)).alias("inserted"),
        F.sum(
            F.when(F.col("owner").isNotNull() & (F.col("owner") != slice_id), 1).otherwise(0)
        ).alias("elsewhere"),
        F.sum(F.when(F.col("owner").isNull(), 1).otherwise(0)).alias("missing"),
    ).first()
    valid_rows = int(agg["valid"] or 0)
    distinct_ids = int(agg["distinct_ids"] or 0) if valid_rows else 0
    return SliceCounts(
        slice_id=slice_id,
        read=parsed.count(),
        quarantined=quarantine.count(),
        duplicates_in_slice=valid_rows - distinct_ids,
        inserted=int(agg["inserted"] or 0),
        duplicates_in_silver=int(agg["elsewhere"] or 0),
        missing=int(agg["missing"] or 0),
    )
