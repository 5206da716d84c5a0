"""The facts the gate proves about a slice, computed from the tables themselves.

read = quarantined + duplicates_in_slice + inserted + duplicates_in_silver,
and no valid key of the slice may be missing from silver. Computing this
from quarantine, the slice's ids and (the slice's reach in) silver, rather than
from a MERGE's metrics, gives the same answer on every rerun and in any order;
`read` is bronze's own commit's row count (bronze appends a slice exactly once). No parse: silver keeps the slice's ids (`transforms.slice_ids`), and
the gate and replay count with the same query (`slice_facts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from slicewise.config import Settings
from slicewise.ledger import Ledger
from slicewise.schemas import BRONZE, KAFKA_POSITION, QUARANTINE, required_columns
from slicewise.tables import of_slice, side_by_side
from slicewise.windows import Reach, own_reach, reach_of, recorded_ids, silver_window


@dataclass(frozen=True)
class SliceCounts:
    slice_id: str
    read: int
    quarantined: int
    duplicates_in_slice: int
    inserted: int  # silver rows whose surviving copy came from this slice
    duplicates_in_silver: int  # valid keys whose surviving copy is in another slice
    missing: int  # valid keys found nowhere in silver: must be 0

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


def slice_facts(
    spark: SparkSession,
    settings: Settings,
    slice_id: str,
    version: int | None = None,
    recorded: Reach | None | bool = False,
) -> tuple[Reach | None, dict[str, int]]:
    """Everything the gate proves about a slice: the reach of silver its MERGE
    looked at (`windows.Reach`: wherever a copy of its keys may be stored), the counts that must reconcile (bronze, quarantine, the slice's ids
    left-joined to silver's window) and the facts of the silver rows that carry the
    slice's keys (how many, duplicates, nulls in required columns, negative Kafka
    positions).

    The slice's ids give its window and totals in one query; then the join and the
    two counts run side by side (three small jobs keep two cores busier than one
    plan that runs them in turn). Silver is read as of `version` when given (the gate
    proves one version: `gate.run_gate`), within the `recorded` reach when one is given
    (the one ingest recorded, which holds at that version: `gate.recorded_reach`),
    else within the reach looked up now."""
    key = list(settings.pipeline.key_columns)
    required = required_columns(settings.pipeline)
    ids = recorded_ids(spark, settings, slice_id)
    totals = ids.agg(
        F.coalesce(F.sum("copies"), F.lit(0)).alias("valid"),
        F.count("*").alias("distinct_ids"),
        F.min("event_date").alias("first"),
        F.max("event_date").alias("last"),
        F.sort_array(F.collect_set("event_date")).alias("dates"),
    ).first()
    if recorded is False:
        reach = reach_of(spark, settings, ids.select(*key), own_reach(totals, settings))
    else:
        reach = recorded
    # The slice's keys are distinct (one row per key), so joining silver's reach to
    # them yields each silver row that carries one of them exactly once, plus one row
    # without `_stored` per key found nowhere: one join and one aggregation, where
    # grouping the whole window by key first cost a shuffle more.
    stored = silver_window(spark, settings, reach, version).select(
        *key,
        F.lit(True).alias("_stored"),
        (F.col("slice_id") == slice_id).alias("_owned"),
        *[F.col(c).alias(f"_{c}") for c in (*required, *KAFKA_POSITION)],
    )
    found = (
        ids.select(*key)
        .join(stored, key, "left")
        .agg(
            F.count_if(F.col("_stored").isNull()).alias("missing"),
            F.count_if(F.col("_stored")).alias("silver_rows"),
            F.count_if(F.col("_owned")).alias("inserted"),
            *[F.count_if(F.col(f"_{c}").isNull() & F.col("_stored")).alias(f"null_{c}")
              for c in required],
            *[F.count_if(F.col(f"_{c}") < 0).alias(f"negative_{c}") for c in KAFKA_POSITION],
        )
    )  # fmt: skip
    found_row, read, quarantined = side_by_side(
        lambda: found.first(),
        lambda: bronze_rows(spark, settings, slice_id),
        lambda: of_slice(spark, settings.table("quarantine"), QUARANTINE, slice_id).count(),
    )
    facts = {k: int(v) for k, v in found_row.asDict().items()}
    facts |= {
        "valid": int(totals["valid"]),
        "distinct_ids": int(totals["distinct_ids"]),
        "read": read,
        "quarantined": quarantined,
    }
    # Every silver row of the slice's keys beyond one per key found is an extra copy.
    found_keys = facts["distinct_ids"] - facts["missing"]
    facts["duplicate_keys"] = facts["silver_rows"] - found_keys
    facts["elsewhere"] = facts["silver_rows"] - facts["inserted"]
    return reach, facts


def bronze_rows(spark: SparkSession, settings: Settings, slice_id: str) -> int:
    """The slice's rows in bronze: as its one commit's metrics gave them to the ledger
    (`bronze.commit_bronze`; bronze appends a slice once and nothing changes its rows
    but retention, which refuses the gate), else counted (a slice ingested before the
    ledger kept them)."""
    recorded = Ledger.of(settings).step(slice_id, "bronze")
    if recorded is not None and "rows" in recorded:
        return int(recorded["rows"])
    return of_slice(spark, settings.table("bronze"), BRONZE, slice_id).count()


def counts_of(slice_id: str, facts: dict[str, int]) -> SliceCounts:
    return SliceCounts(
        slice_id=slice_id,
        read=facts["read"],
        quarantined=facts["quarantined"],
        duplicates_in_slice=facts["valid"] - facts["distinct_ids"],
        inserted=facts["inserted"],
        duplicates_in_silver=facts["elsewhere"],
        missing=facts["missing"],
    )


def slice_counts(spark: SparkSession, settings: Settings, slice_id: str) -> SliceCounts:
    """The slice's counts, from the tables as they are now."""
    _, facts = slice_facts(spark, settings, slice_id)
    return counts_of(slice_id, facts)
