"""Replay a slice's quarantine after a fix (a parser change, a raised size limit).

Re-parses the slice's bronze rows with today's rules and writes them through
silver's own writes (`silver.write_slice`), replacing the slice's quarantine rows
and ids (`slice_ids`) instead of appending them, quarantine last: a record leaves
quarantine only once silver holds it. The MERGE keeps the copy the survivor rule
prefers, so it is safe to repeat. Run it again if it is interrupted; the counts
reconcile once it completes.

Rules that became stricter withdraw records: where silver's row of a key is this
slice's copy and not the one today's rules pick (quarantined now, or beaten now by
another of the slice's copies), it leaves silver (`silver.withdraw`), and the copies
other slices hold of the key, valid by today's rules, come in (the survivor rule
picks among them and the slice's own, as their MERGEs would have). Both run before
the slice's own writes, and a key with no row at all counts as withdrawn, so a rerun
after a cut-off finds the same keys. The
replay records the event dates it changed: `publish` rebuilds gold there too, and
`announce` announces the slice again (the replay is a new revision of it).
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from slicewise.bronze import require_bronze_rows
from slicewise.config import Settings
from slicewise.errors import OperationalError
from slicewise.gate_facts import SliceCounts, slice_counts
from slicewise.ledger import BRONZE_DROPPED, Ledger
from slicewise.schemas import BRONZE, KAFKA_POSITION, slice_ids_schema
from slicewise.silver import (
    merge_survivors,
    parse,
    parsed_slice,
    withdraw,
    write_slice,
)
from slicewise.slices import Slice
from slicewise.tables import of_slice, read_table, replace_slice, table_version
from slicewise.transforms import dedup_within, event_date_span, valid_events
from slicewise.windows import Reach, Window, recorded_ids, silver_window, slice_reach

log = logging.getLogger(__name__)


def run_replay(spark: SparkSession, settings: Settings, slice_id: str) -> SliceCounts:
    ledger = Ledger.of(settings)
    sl = ledger.load_slice(slice_id)  # fails clearly if the slice is unknown
    require_bronze_rows(ledger, slice_id)

    def replace(rows: DataFrame, table: str) -> None:
        replace_slice(rows, settings.table(table), slice_id)

    parsed = parsed_slice(spark, settings, slice_id)
    changed, regate = withdraw_stricter(spark, settings, ledger, sl, parsed)
    # No idempotent-write id for the MERGE: the slice's id was spent by its first
    # MERGE, and this one is idempotent by content (the survivor rule).
    write_slice(spark, settings, slice_id, parsed, replace, merge_id=None, quarantine_last=True)
    counts = slice_counts(spark, settings, slice_id)
    changes = {
        "changed": None if changed is None else [d.isoformat() for d in changed],
        # Slices whose copies took withdrawn rows' places: their gate must see them.
        "regate": regate,
        # At or above its writes' versions: what its publication must hold (`publish`).
        "silver_version": table_version(spark, settings.table("silver")),
    }
    ledger.record_step(slice_id, "replay", {**asdict(counts), **changes})
    log.info("replayed quarantine of %s: %s", slice_id, counts.describe())
    if regate:
        log.warning(
            "replay of %s brought in copies of slice(s) %s: run their gate too (`slicewise gate "
            "--slice-id ...`) before publishing (docs/RUNBOOK.md#publication-blocked)",
            slice_id,
            ", ".join(regate),
        )
    return counts


class ReplayRefused(OperationalError):
    """A stricter replay would withdraw keys whose only other copies are gone."""


def withdraw_stricter(
    spark: SparkSession, settings: Settings, ledger: Ledger, sl: Slice, parsed: DataFrame
) -> tuple[Window | None, list[str]]:
    """Withdraw the slice's stored copies that today's rules no longer pick; bring in the
    other slices' copies of their keys. The event dates changed (None: nothing
    withdrawn), and the slices whose copies were brought in."""
    key = list(settings.pipeline.key_columns)
    withdrawn = not_picked_now(spark, settings, sl.slice_id, parsed).cache()
    try:
        span = event_date_span(withdrawn).first()
        if span["first"] is None:
            return None, []
        keys = withdrawn.select(*key)
        checked, bronze_at = refuse_dropped_holders(spark, settings, ledger, sl.slice_id, keys)
        stored = (span["first"], span["last"])
        withdraw(spark, settings, sl, keys, Reach(stored))
        log.warning("replay of %s withdrew copies its rules no longer pick", sl.slice_id)
        others, merged = other_copies(
            spark, settings, ledger, sl.slice_id, keys, set(checked), bronze_at
        )
        if others is None:
            return stored, merged
        return (min(stored[0], others[0]), max(stored[1], others[1])), merged
    finally:
        withdrawn.unpersist()


def refuse_dropped_holders(
    spark: SparkSession, settings: Settings, ledger: Ledger, slice_id: str, keys: DataFrame
) -> tuple[list[str], int]:
    """Refuse, before any write, a withdrawal of keys whose copies in other slices can no
    longer be read (their bronze rows dropped by retention): the keys would leave silver
    with no copy to take their place. Returns those other slices and a version of bronze
    that holds their rows: taken before the ledger is read, and retention records a
    drop before it deletes, so a drop racing the replay deletes after that version
    (which VACUUM keeps for longer than an attempt runs)."""
    version = table_version(spark, settings.table("bronze"))
    found = holders(spark, settings, slice_id, keys)
    dropped = [h for h in found if ledger.step(h, BRONZE_DROPPED) is not None]
    if dropped:
        raise ReplayRefused(
            f"the replay of {slice_id} would withdraw keys its rules no longer accept whose "
            f"other copies are in slice(s) {', '.join(dropped)}, whose bronze rows retention "
            "deleted (maintenance.bronze_retain): no copy could take their place, and the "
            "events would leave silver and gold. Nothing was written. The slice's rows stay "
            "as its earlier rules wrote them; replay it with rules that still accept those "
            "records, or leave it (docs/RUNBOOK.md#a-replay-is-refused)."
        )
    return found, version


def holders(spark: SparkSession, settings: Settings, slice_id: str, keys: DataFrame) -> list[str]:
    """The other slices `slice_ids` records a copy of one of `keys` for. Reads all of
    `slice_ids`: a replay is rare and run by hand."""
    key = list(settings.pipeline.key_columns)
    ids = read_table(spark, settings.table("slice_ids"), slice_ids_schema(settings.pipeline))
    found = (
        ids.where(F.col("slice_id") != slice_id)
        .join(keys, key, "left_semi")
        .select("slice_id")
        .distinct()
        .collect()
    )
    return sorted(r.slice_id for r in found)


def not_picked_now(
    spark: SparkSession, settings: Settings, slice_id: str, parsed: DataFrame
) -> DataFrame:
    """The slice's recorded keys (with their recorded event dates) whose row in silver is
    the slice's own copy but not the one its survivor rule picks by today's rules (that
    copy is quarantined now, or another of its copies now beats it), or which have no
    row at all: an earlier attempt of this replay withdrew it and was cut off before
    the copies that take its place. By position, not by key, so a copy quarantined now
    leaves silver though the slice holds another valid copy of its key; and the same
    keys on every rerun until the replay rewrites the slice's `slice_ids`."""
    pipeline = settings.pipeline
    key = list(pipeline.key_columns)
    today = dedup_within(valid_events(parsed, pipeline), pipeline).select(
        *key, *[F.col(c).alias(f"_today_{c}") for c in KAFKA_POSITION]
    )
    stored = silver_window(spark, settings, slice_reach(spark, settings, slice_id)).select(
        *key, "slice_id", *KAFKA_POSITION
    )
    same = F.lit(True)
    for c in KAFKA_POSITION:
        same = same & F.col(c).eqNullSafe(F.col(f"_today_{c}"))
    return (
        recorded_ids(spark, settings, slice_id)
        .select(*key, "event_date")
        .join(stored.withColumnRenamed("slice_id", "_holder"), key, "left")
        .join(today, key, "left")
        .where(F.col("_holder").isNull() | ((F.col("_holder") == slice_id) & ~same))
        .select(*key, "event_date")
    )


def other_copies(
    spark: SparkSession,
    settings: Settings,
    ledger: Ledger,
    slice_id: str,
    keys: DataFrame,
    checked: set[str],
    bronze_at: int,
) -> tuple[Window | None, list[str]]:
    """MERGE the copies of `keys` that other slices hold (parsed from their bronze rows by
    today's rules; the `checked` slices' as of bronze's version `bronze_at`); the span of the event dates their MERGEs
    looked at (far dates included), and those slices. Each MERGE is tagged with the
    slice whose copies it writes, so its gate must see them before a publication reads
    them. The holders are read after the withdrawal: a slice whose MERGE found the
    withdrawn copy (and so inserted nothing) recorded its ids before that MERGE, so it
    is among them, and read as bronze is now (a slice racing the replay)."""
    key = list(settings.pipeline.key_columns)
    spans, merged = [], []
    for other in holders(spark, settings, slice_id, keys):
        if other in checked:
            bronze = bronze_rows_at(spark, settings, other, bronze_at)
        elif ledger.step(other, BRONZE_DROPPED) is not None:
            log.warning("slice %s's bronze rows are gone: its copies stay out", other)
            continue
        else:
            bronze = of_slice(spark, settings.table("bronze"), BRONZE, other)
        copies = valid_events(parse(bronze, settings), settings.pipeline).join(
            keys, key, "left_semi"
        )
        kept = dedup_within(copies, settings.pipeline)
        into = merge_survivors(spark, settings, kept, None, other)
        if into is not None:
            spans.extend(into.reach.ranges())
            merged.append(other)
    if not spans:
        return None, merged
    return (min(w[0] for w in spans), max(w[1] for w in spans)), merged


def bronze_rows_at(
    spark: SparkSession, settings: Settings, slice_id: str, version: int
) -> DataFrame:
    """A slice's bronze rows as of a version of bronze."""
    bronze = (
        spark.read.format("delta").option("versionAsOf", version).load(settings.table("bronze"))
    )
    return bronze.where(F.col("slice_id") == slice_id)
