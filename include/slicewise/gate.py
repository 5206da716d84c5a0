"""The quality gate: prove the slice's effect on silver before anything is published.

The gate computes the slice's facts (`gate_facts.slice_facts`: one query for the
window and totals, one for its far dates, then three side by side) and
Great Expectations validates them, one expectation per fact (suite `slice_facts`,
on the one-row frame of facts, in pandas: no further Spark job):
  * bronze rows = quarantined + duplicates + silver rows, and no valid event_id of
    the slice is missing from silver;
  * the silver rows that carry one of the slice's keys, within its reach (its dedup
    horizon and the far dates where other slices recorded copies of its keys:
    wherever such a row can be), hold each key once, no nulls in required columns, no negative Kafka
    position, and silver has exactly the expected columns. Its MERGE can only have
    written rows with its own keys, so this proves the slice added no duplicate, at
    a cost that follows the slice, not silver.
When a fact about the silver rows fails, or the pipeline's definition declares
expectations of its own, the row-level suite (`silver_slice`: the built-in row
checks plus the declared ones) runs on those rows too, so the report names the
offending keys. A few aggregations instead of GX's ~50 small jobs over the rows: on a
passing slice of a pipeline without extra expectations that is all the gate reads.
The slice's keys are those silver kept (`slice_ids`): the gate reads tables only and
never parses the slice again.
A failure raises `GateFailed` naming the offending ids and counts, after keeping
the Data Docs in the lakehouse (slicewise.data_docs) and the outcome (with the counts
and the pages' URLs) in the ledger.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone

import pandas as pd
from pyspark.sql import SparkSession

from slicewise.bronze import require_bronze_rows
from slicewise.commits import commits_above, last_commit
from slicewise.config import Settings
from slicewise.data_docs import keep
from slicewise.errors import OperationalError
from slicewise.faults import fault_point
from slicewise.gate_facts import SliceCounts, counts_of, slice_facts
from slicewise.gx_adapter import GateReport, gxe, validate
from slicewise.ledger import Ledger
from slicewise.pipelines import Pipeline, PipelineDefinitionError
from slicewise.schemas import required_columns, silver_schema
from slicewise.tables import read_table, table_version
from slicewise.windows import Reach, recorded_ids, silver_window

log = logging.getLogger(__name__)


class GateFailed(OperationalError):
    """Raised by `run_gate` when a slice fails its expectations;
    Airflow marks the task failed and logs the message. `report` is the failed report."""

    def __init__(self, message: str, report: GateReport | None = None) -> None:
        super().__init__(message)
        self.report = report


SUITE_VERSION = "3"


def row_facts(pipeline: Pipeline) -> tuple[str, ...]:
    """Facts about the silver rows; when one fails, the row-level suite names the rows."""
    return (
        "duplicate_keys",
        *[f"null_{c}" for c in required_columns(pipeline)],
        "negative_kafka_partition",
        "negative_kafka_offset",
        "unexpected_silver_columns",
        "absent_silver_columns",
    )


def slice_facts_suite(pipeline: Pipeline) -> list[gxe.Expectation]:
    def none(fact: str) -> gxe.Expectation:
        return gxe.ExpectColumnValuesToBeBetween(column=fact, min_value=0, max_value=0)

    return [
        gxe.ExpectColumnPairValuesToBeEqual(column_A="read", column_B="accounted"),
        none("missing"),
        *[none(fact) for fact in row_facts(pipeline)],
    ]


def declared_expectations(pipeline: Pipeline) -> list[gxe.Expectation]:
    """The definition's own expectations, as Great Expectations objects; a name GX does
    not know, or arguments it refuses, fail naming the pipeline and the item."""
    built = []
    for i, item in enumerate(pipeline.expectations):
        ((name, kwargs),) = item.items()
        cls = getattr(gxe, "".join(part.title() for part in name.split("_")), None)
        if not (isinstance(cls, type) and issubclass(cls, gxe.Expectation)):
            raise PipelineDefinitionError(
                f"pipeline {pipeline.name!r}, expectations[{i}]: {name!r} is not a Great "
                "Expectations expectation (see https://greatexpectations.io/expectations)."
            )
        try:
            built.append(cls(**(kwargs or {})))
        except Exception as exc:
            raise PipelineDefinitionError(
                f"pipeline {pipeline.name!r}, expectations[{i}] {name}: {exc}"
            ) from None
    return built


def silver_slice_suite(pipeline: Pipeline) -> list[gxe.Expectation]:
    key = list(pipeline.key_columns)
    unique = (
        gxe.ExpectColumnValuesToBeUnique(column=key[0])
        if len(key) == 1
        else gxe.ExpectCompoundColumnsToBeUnique(column_list=key)
    )
    return [
        gxe.ExpectTableColumnsToMatchSet(
            column_set=[f.name for f in silver_schema(pipeline).fields], exact_match=True
        ),
        unique,
        *[gxe.ExpectColumnValuesToNotBeNull(column=c) for c in required_columns(pipeline)],
        gxe.ExpectColumnValuesToBeBetween(column="kafka_offset", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="kafka_partition", min_value=0),
        *declared_expectations(pipeline),
    ]


def run_gate(spark: SparkSession, settings: Settings, slice_id: str) -> dict:
    """Validate one slice; record the outcome; raise `GateFailed` if it failed."""
    ledger = Ledger.of(settings)
    ledger.load_slice(slice_id)
    require_bronze_rows(ledger, slice_id)
    if ledger.step(slice_id, "silver") is None:
        raise GateFailed(
            f"slice {slice_id} has not been through silver; clear its `ingest` task (or run "
            f"`slicewise ingest --slice-id {slice_id}`) first. Nothing was published."
        )
    version = validated_version(spark, settings, ledger, slice_id)
    known = recorded_reach(ledger, slice_id, version)
    reach, counts, reports = _validate(spark, settings, slice_id, version, known)
    success = all(r.success for r in reports)
    now = table_version(spark, settings.table("silver")) if not success else version
    if now > version:
        # A later commit may have settled what failed at the slice's last commit: a key
        # stored twice there, by its MERGE racing another slice's far copy, that a third
        # slice's MERGE and clean-up left once (`silver.settle_far_copies`). Validated
        # as it is now, as a gate of an old slice is; its publication may then wait for
        # the slices committed in between.
        log.warning(
            "gate of %s failed at silver v%d, its last commit; validating silver as it is "
            "now (v%d)",
            slice_id,
            version,
            now,
        )
        version = now
        reach, counts, reports = _validate(spark, settings, slice_id, version)
        success = all(r.success for r in reports)
    summary = "\n".join(r.summary() for r in reports)
    outcome = {
        "success": success,
        "silver_version": version,
        # Where the gate looked: publication rebuilds gold there (`publish.run_publish`).
        "reach": None if reach is None else reach.record(),
        "suite_version": SUITE_VERSION,
        "counts": asdict(counts),
        "summary": summary,
        "data_docs": [r.docs_url for r in reports],
    }
    ledger.record_step(slice_id, "gate", settled(ledger.step(slice_id, "gate"), outcome))
    fault_point("gate.validated", settings, slice_id)
    if not success:
        failed = next(r for r in reversed(reports) if not r.success)  # the most specific
        raise GateFailed(
            f"gate FAILED for slice {slice_id} ({counts.describe()}):\n{summary}\n"
            f"{_hint(counts)}Nothing was published, and no other slice publishes until this one "
            "passes. See docs/RUNBOOK.md#gate-failed.",
            failed,
        )
    log.info("gate passed for %s: %s", slice_id, counts.describe())
    return outcome


def validated_version(
    spark: SparkSession, settings: Settings, ledger: Ledger, slice_id: str
) -> int:
    """The one version of silver the gate proves: its slice's last commit to it.

    Publication may read a version V holding a slice's commits only if a passing gate
    of that slice validated a version at or below V and at or above those commits
    (`publish.proved_prefix`): then each of its rows in V was in what the gate saw. As
    of its own last commit, the gate never makes a publication wait for a slice that
    committed after it (the version the gate starts at would). A slice whose last
    commit is older than VACUUM's reach (its files may be gone: a gate rerun days
    later) or that has none above the last publication is validated as silver is now,
    which is as sound; its publication may then wait for slices in flight. So is one
    after whose last commit silver's rows were changed by hand (a repair, a bad manual
    write: `commits.Commit.by_hand`), so that its gate sees what was written."""
    # A log cut below the slice's commit (Delta's cleanup): validated as silver is now.
    floor = ledger.verified_floor()
    commits = commits_above(spark, settings.table("silver"), floor, accept_truncated=True)
    last = last_commit(commits, slice_id)
    readable = settings.pipeline.maintenance.vacuum_retain - settings.step_timeout
    if last is None or time.time() - last.at > readable.total_seconds():
        return commits[-1].version
    if any(c.by_hand for c in commits if c.version > last.version):
        return commits[-1].version  # rows written by hand since: the gate sees them too
    return last.version


def recorded_reach(ledger: Ledger, slice_id: str, version: int) -> Reach | None | bool:
    """The reach the slice's ingest recorded, where it holds for silver at `version`
    (False where it may not: the gate looks the far dates up again).

    Ingest looked its far dates up after reading silver's version V (`silver.merge_slice`).
    Every commit at or below V came before that lookup, and every slice records its ids
    before it commits: so at any version at or below V, each row of the slice's keys
    lies in a date the lookup found. Above V, a slice that recorded after the lookup
    may have moved one elsewhere; a replay of the slice may have changed its keys. A
    record of an earlier slicewise (no `reach_looked_up_after`) is looked up again. The
    protocol model proves it (`gate_reach_of_silver`)."""
    silver = ledger.step(slice_id, "silver") or {}
    looked_up_after = silver.get("reach_looked_up_after")
    if looked_up_after is None or version > int(looked_up_after):
        return False
    if ledger.step(slice_id, "replay") is not None:
        return False
    return Reach.of_record(silver) if silver.get("window") else None


def settled(previous: dict | None, outcome: dict) -> dict:
    """What the ledger keeps of a gate run: one truth per slice.

    A slice that passed keeps the outcome it was first published with; a passing
    rerun (a cleared task, a backfill) is listed beside it under `rechecks`, with
    its counts only when they differ. They can: silver's survivor is the lowest
    Kafka position, so a later slice holding an earlier copy of an id takes that
    row over, and a reprocess moves records out of quarantine. A failing run
    replaces the outcome, since nothing may be published past it.
    """
    if not (previous and previous.get("success") and outcome["success"]):
        return outcome
    same = previous.get("counts") == outcome["counts"]
    recheck = {
        "recorded_at": datetime.now(timezone.utc).isoformat(),
        "counts": None if same else outcome["counts"],
    }
    # The version proved is the newest run's: publication reads what this run saw.
    return {
        **previous,
        "silver_version": outcome.get("silver_version"),
        "reach": outcome.get("reach"),
        "rechecks": [*previous.get("rechecks", []), recheck],
    }


def _validate(
    spark: SparkSession,
    settings: Settings,
    slice_id: str,
    version: int,
    known: Reach | None | bool = False,
) -> tuple[Reach | None, SliceCounts, list[GateReport]]:
    pipeline = settings.pipeline
    schema = silver_schema(pipeline)
    row_suite = silver_slice_suite(pipeline)  # first: a bad declared expectation fails fast
    reach, facts = slice_facts(spark, settings, slice_id, version, known)
    counts = counts_of(slice_id, facts)
    silver = read_table(spark, settings.table("silver"), schema)
    expected = {f.name for f in schema.fields}
    facts |= {
        "accounted": counts.accounted,
        "unexpected_silver_columns": len(set(silver.columns) - expected),
        "absent_silver_columns": len(expected - set(silver.columns)),
    }
    docs = settings.data_docs_dir
    reports = [
        validate(
            pd.DataFrame([facts]),
            f"slice_facts_v{SUITE_VERSION}",
            slice_facts_suite(pipeline),
            docs,
            slice_id,
        )
    ]
    if pipeline.expectations or any(facts[f] for f in row_facts(pipeline)):
        key = list(pipeline.key_columns)
        ids = recorded_ids(spark, settings, slice_id).select(*key)
        rows = silver_window(spark, settings, reach, version).join(ids, key, "left_semi")
        reports.append(validate(rows, f"silver_slice_v{SUITE_VERSION}", row_suite, docs, slice_id))
    # Kept where every host reads them, before the verdict is recorded or raised.
    return (
        reach,
        counts,
        [replace(r, docs_url=keep(settings, r.site, r.docs_index)) for r in reports],
    )


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
