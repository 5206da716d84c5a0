"""The quality gate: prove the slice's effect on silver before anything is published.

Two suites, versioned here in code:
  * silver_slice: the silver rows that carry one of the slice's event_ids, within
    its dedup horizon, have unique, non-null event_ids, the expected columns and sane
    values. Its MERGE can only have written rows with its own ids, so this proves
    the slice added no duplicate, at a cost that follows the slice, not silver;
  * slice_reconciliation: bronze rows = quarantined + duplicates + silver rows,
    and no valid event_id of the slice is missing from silver.
The slice's ids are those silver kept (`slice_ids`): the gate reads tables only and
never parses the slice again.
A failure raises `GateFailed` naming the offending ids and counts, after writing
Data Docs to `<state>/data_docs` and the outcome to the ledger.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

import great_expectations.expectations as gxe
from pyspark.sql import SparkSession

from slicewise.config import Settings
from slicewise.faults import fault_point
from slicewise.gate_engine import GateFailed, GateReport, validate
from slicewise.ledger import Ledger
from slicewise.reconcile import (
    SliceCounts,
    recorded_ids,
    silver_window,
    slice_counts,
    slice_window,
)
from slicewise.tables import SILVER

log = logging.getLogger(__name__)

SUITE_VERSION = "1"


def silver_slice_suite() -> list[gxe.Expectation]:
    return [
        gxe.ExpectTableColumnsToMatchSet(
            column_set=[f.name for f in SILVER.fields], exact_match=True
        ),
        gxe.ExpectColumnValuesToNotBeNull(column="event_id"),
        gxe.ExpectColumnValuesToBeUnique(column="event_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="event_type"),
        gxe.ExpectColumnValuesToNotBeNull(column="occurred_at"),
        gxe.ExpectColumnValuesToNotBeNull(column="event_date"),
        gxe.ExpectColumnValuesToBeBetween(column="kafka_offset", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="kafka_partition", min_value=0),
    ]


def reconciliation_suite() -> list[gxe.Expectation]:
    return [
        gxe.ExpectColumnPairValuesToBeEqual(column_A="read", column_B="accounted"),
        gxe.ExpectColumnValuesToBeBetween(column="missing", min_value=0, max_value=0),
    ]


def run_gate(spark: SparkSession, settings: Settings, slice_id: str) -> dict:
    """Validate one slice; record the outcome; raise `GateFailed` if it failed."""
    ledger = Ledger(settings.ledger_dir, settings.topic)
    ledger.load_slice(slice_id)
    if ledger.step(slice_id, "silver") is None:
        raise GateFailed(
            f"slice {slice_id} has not been through silver; run `slicewise silver --slice-id "
            f"{slice_id}` (or clear the silver task) first. Nothing was published."
        )
    counts, reports = _validate(spark, settings, slice_id)
    success = all(r.success for r in reports)
    summary = "\n".join(r.summary() for r in reports)
    outcome = {
        "success": success,
        "suite_version": SUITE_VERSION,
        "counts": asdict(counts),
        "summary": summary,
        "data_docs": [str(r.docs_index) for r in reports],
    }
    ledger.record_step(slice_id, "gate", outcome)
    fault_point("gate.validated", settings, slice_id)
    if not success:
        failed = next(r for r in reports if not r.success)
        raise GateFailed(
            f"gate FAILED for slice {slice_id} ({counts.describe()}):\n{summary}\n"
            f"{_hint(counts)}Nothing was published. See docs/RUNBOOK.md#gate-failed.",
            failed,
        )
    log.info("gate passed for %s: %s", slice_id, counts.describe())
    return outcome


def _validate(
    spark: SparkSession, settings: Settings, slice_id: str
) -> tuple[SliceCounts, list[GateReport]]:
    window = slice_window(spark, settings, slice_id)
    counts = slice_counts(spark, settings, slice_id, window)
    ids = recorded_ids(spark, settings, slice_id).select("event_id")
    rows = silver_window(spark, settings, window).join(ids, "event_id", "left_semi")
    counts_df = spark.createDataFrame(
        [(counts.read, counts.accounted, counts.missing)], "read long, accounted long, missing long"
    )
    docs = settings.data_docs_dir
    return counts, [
        validate(rows, f"silver_slice_v{SUITE_VERSION}", silver_slice_suite(), docs, slice_id),
        validate(
            counts_df,
            f"slice_reconciliation_v{SUITE_VERSION}",
            reconciliation_suite(),
            docs,
            slice_id,
        ),
    ]


def _hint(counts: SliceCounts) -> str:
    """A likely cause the counts alone point at."""
    ids = counts.inserted + counts.duplicates_in_silver + counts.missing
    if ids == 0 and counts.read > counts.quarantined:
        return (
            "Silver kept no event ids for this slice: it ran before slicewise kept them "
            "(slice_ids) or did not finish. Run silver for the slice again (safe: its writes "
            "are idempotent), then the gate.\n"
        )
    return ""
