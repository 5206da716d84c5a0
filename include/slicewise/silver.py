"""Silver: each valid key once, via an idempotent MERGE bounded by the horizon.

The slice is parsed once (compiled from the pipeline's definition: by `ingest` off
its one Kafka read, or here off bronze, `parsed_slice`), and `write_slice` writes it:
its bad records go to quarantine, its valid events' keys to `slice_ids` (what the
gate and publish need of it), and its events into silver. Within the slice the
survivor rule picks one copy per key (`survivors`: the lowest Kafka position unless
the definition orders by a field). Across slices the MERGE replaces a stored copy
only by one the same rule prefers, so silver ends the same whatever order slices run
in and however often. The MERGE only looks at silver rows whose event_date lies
within the slice's reach (`windows.Reach`): the dedup horizon of its own dates, and
the far dates where `slice_ids` says another slice holds a copy of one of its keys.
Delta prunes every other partition, so its cost follows the slice, not the table,
and copies of a key any distance apart still end as one row. Silver has deletion
vectors: a MERGE marks the rows it replaces instead of rewriting every file that
holds a matched row.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import StructField, StructType

from slicewise.avro import AvroSchemas, unreadable
from slicewise.commits import slice_tag, tagged_slices
from slicewise.config import Settings
from slicewise.contract import beats_sql, key_match_sql, parse_events
from slicewise.errors import OperationalError
from slicewise.faults import fault_point
from slicewise.ledger import Ledger
from slicewise.pipelines import Pipeline
from slicewise.schemas import BRONZE, QUARANTINE, silver_schema, slice_ids_schema
from slicewise.slices import Slice
from slicewise.tables import (
    append_slice_once,
    conform,
    delta_ref,
    history,
    ids_may_be_forgotten,
    latest_commit,
    of_slice,
    retry_on_conflict,
    side_by_side,
    table_properties,
    table_version,
)
from slicewise.transforms import (
    duplicated,
    event_date_span,
    kept_once,
    quarantined,
    slice_ids,
    survivors,
    valid_events,
)
from slicewise.windows import Reach, own_reach, reach_of, recorded_ids, silver_window

log = logging.getLogger(__name__)


def silver_properties(pipeline: Pipeline) -> dict[str, str]:
    """Silver's table properties. With deletion vectors a MERGE that replaces a row marks
    it deleted instead of rewriting its whole file, so the MERGE's cost stays flat as
    silver grows; a definition whose readers lack the feature turns them off."""
    return {"delta.enableDeletionVectors": str(pipeline.deletion_vectors).lower()}


def avro_schemas(settings: Settings) -> AvroSchemas | None:
    """An Avro pipeline's reader schema and its subject's writer schemas, fetched once per
    slice (a version's schema never changes, so a retry reads the same ones); None for
    a JSON pipeline."""
    pipeline, registry = settings.pipeline, settings.schema_registry
    if pipeline.format == "json" or registry is None:
        return None
    reader = registry.version(settings.schema_subject, pipeline.reader_version)
    writers = {v.id: v.schema for v in registry.versions(settings.schema_subject)}
    for sid in sorted(set(writers) - set(AvroSchemas(reader.schema, writers).readable())):
        log.warning(
            "schema %d of subject %s cannot be read with its version %s: its records go to "
            "quarantine as unreadable_schema (%s)",
            sid,
            settings.schema_subject,
            reader.version,
            unreadable(reader.schema, writers[sid]),
        )
    return AvroSchemas(reader.schema, writers)


def parse(bronze: DataFrame, settings: Settings) -> DataFrame:
    """The slice's rows parsed by the pipeline's definition (and its format)."""
    return parse_events(bronze, settings.pipeline, settings.max_value_bytes, avro_schemas(settings))


def parsed_slice(spark: SparkSession, settings: Settings, slice_id: str) -> DataFrame:
    """The slice's bronze rows, parsed and cached; the caller unpersists.

    Silver filters them (valid, quarantined, ids) several times. Uncached, Spark
    pushes each filter on `reason` below the parse and evaluates it inline, which
    costs several parses per row (see `parse_events`).
    """
    bronze = of_slice(spark, settings.table("bronze"), BRONZE, slice_id)
    return parse(bronze, settings).cache()


@contextmanager
def idempotent_dml(spark: SparkSession, app_id: str | None) -> Iterator[None]:
    """Delta skips the DML if this app id already committed, and fences racers."""
    if app_id is None:
        yield
        return
    spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
    spark.conf.set("spark.databricks.delta.write.txnVersion", "0")
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


@contextmanager
def commit_tag(spark: SparkSession, attempt: str) -> Iterator[None]:
    """The DML's commit carries `attempt` in its userMetadata (found by `tables.tagged_commit`)."""
    if not attempt:
        yield
        return
    spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", attempt)
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")


def ensure_silver(spark: SparkSession, path: str, pipeline: Pipeline) -> None:
    """Create silver (partitioned by event_date, with `silver_properties`), or bring a
    silver made by an earlier definition or version up to date: the properties it
    lacks, and a column for each field the definition gained (metadata only, no
    rewrite: the rows written before read null there). A field whose type changed
    cannot be followed in place and fails, naming the field."""
    properties = table_properties(spark, path)
    schema = silver_schema(pipeline)
    if properties is None:
        # An empty append creates the table: its columns (nullable, as SQL's DDL would
        # make them), its partitioning and, from the `delta.*` writer options, its
        # properties. Not CREATE TABLE: SQL takes any location holding a `_delta_log`
        # folder for a table, and a first commit cut off there (a server killed while
        # creating silver leaves `_delta_log/_staged_commits/` and no commit) would make
        # CREATE TABLE IF NOT EXISTS a no-op and every MERGE after it fail with
        # DELTA_TABLE_NOT_FOUND. An append writes the first commit whatever the folder
        # holds; a racer creating it too loses with a commit conflict and retries.
        columns = StructType([StructField(f.name, f.dataType) for f in schema.fields])
        writer = spark.createDataFrame([], columns).write.format("delta").mode("append")
        for key, value in silver_properties(pipeline).items():
            writer = writer.option(key, value)
        writer.partitionBy("event_date").save(path)
        return
    wanted = silver_properties(pipeline)
    if any(properties.get(k) != v for k, v in wanted.items()):
        setting = ", ".join(f"'{k}' = '{v}'" for k, v in wanted.items())
        log.info("silver at %s: setting %s", path, setting)
        spark.sql(f"ALTER TABLE {delta_ref(path)} SET TBLPROPERTIES ({setting})").collect()
        if not pipeline.deletion_vectors:
            log.warning(
                "silver at %s had deletion vectors: new MERGEs write none, but readers that "
                "lack the feature still refuse the table until it is dropped (docs/PIPELINES.md, "
                "deletion_vectors)",
                path,
            )
    added = evolve(spark.read.format("delta").load(path).schema, schema, pipeline.name)
    if added:
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in added)
        log.info("silver at %s: adding columns %s", path, columns)
        spark.sql(f"ALTER TABLE {delta_ref(path)} ADD COLUMNS ({columns})").collect()


def evolve(stored: StructType, wanted: StructType, pipeline: str) -> list[StructField]:
    """The columns silver lacks for the definition; a changed type is refused."""
    have = {f.name: f.dataType for f in stored.fields}
    for f in wanted.fields:
        if f.name in have and have[f.name] != f.dataType:
            raise SchemaChangeRefused(
                f"pipeline {pipeline!r}: silver's column `{f.name}` is "
                f"{have[f.name].simpleString()}, the definition now says "
                f"{f.dataType.simpleString()}. A type cannot change in place: declare the new "
                "type as a new field (with `column:`), or keep the old one; records of the "
                "other type go to quarantine as wrong_type. See docs/PIPELINES.md#evolution."
            )
    return [f for f in wanted.fields if f.name not in have]


class SchemaChangeRefused(OperationalError):
    """The definition changed a field's type; silver cannot follow without a rewrite."""


def merge_into_silver(
    spark: SparkSession,
    path: str,
    pipeline: Pipeline,
    events: DataFrame,
    reach: Reach,
    app_id: str | None,
    writer: str,
    merging: Callable[[], None] = lambda: None,
    sources: int | None = None,
) -> bool:
    """Insert new keys; replace a stored copy only by one the survivor rule prefers.
    Whether it may have stored a copy twice (`copied_twice`); `sources`: how many events.

    One MERGE, idempotent by content: a copy in silver is replaced only by an event
    that beats it, and a writer that commits in between fails its commit (Delta's
    conflict check), so the retry sees that writer's rows. With an `app_id` it commits
    at most once (and fences racers); without, it is still idempotent by content, which
    quarantine replay relies on. Delta returns no row for a MERGE it skipped as
    committed by an earlier attempt; an attempt of an earlier slicewise may have
    merged insert-only after a probe and died before checking it, so silver is then
    asked for a copy the slice still beats, and the MERGE runs again without its id.
    Each commit is tagged with `writer`, the slice whose gate must see its rows
    (`commits.slice_tag`). `merging` runs just before the MERGE (a fault point).

    Delta's MERGE updates every stored row an event matches: where silver holds a key
    twice within the reach (two slices racing with copies far apart, before either
    cleaned up: `settle_far_copies`), an event that beats both is then stored twice,
    the same copy on two rows. Its metrics show it (more rows updated and inserted than
    events), and the caller's clean-up then runs. For a MERGE Delta skipped, they are
    the ones its first attempt committed (`committed_merge_metrics`).
    """
    ensure_silver(spark, path, pipeline)
    # SQL rather than DeltaTable.merge: the same statement runs in-process and over
    # Spark Connect, which carries SQL but not Delta's Python API.
    source = f"slice_events_{uuid.uuid4().hex}"
    events.createOrReplaceTempView(source)
    on = f"{reach.sql('t.event_date')} AND {key_match_sql(pipeline)}"
    statement = (
        f"MERGE INTO {delta_ref(path)} AS t USING {source} AS s ON {on} "
        f"WHEN MATCHED AND {beats_sql(pipeline)} THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )

    def merge(app_id: str | None) -> Row | None:
        """The MERGE's metrics (None: Delta skipped it, `app_id` committed before)."""
        with idempotent_dml(spark, app_id), commit_tag(spark, slice_tag([writer])):
            return next(iter(spark.sql(statement).collect()), None)

    def beaten() -> int:
        """How many stored copies an event beats."""
        # A count, not LIMIT 1: a limit scans partitions in growing rounds, a job each.
        probe = (
            f"SELECT count(*) FROM {delta_ref(path)} AS t JOIN {source} AS s "
            f"ON {on} WHERE {beats_sql(pipeline)}"
        )
        return int(spark.sql(probe).first()[0])

    try:
        merging()
        metrics = merge(app_id)
        if metrics is None and beaten():
            log.info("silver at %s: a copy stored since the slice's MERGE is beaten", path)
            metrics = merge(None)
    finally:
        spark.catalog.dropTempView(source)
    if metrics is None:  # Delta skipped it: the attempt that committed it left its metrics
        metrics = committed_merge_metrics(spark, path, writer)
    return sources is None or metrics is None or copied_twice(metrics, sources)


def copied_twice(metrics: Row | dict, sources: int) -> bool:
    """Whether a MERGE of `sources` events replaced two stored rows with one of them: each
    event updates or inserts one row unless it matched a key stored twice."""
    return int(metrics["num_updated_rows"]) + int(metrics["num_inserted_rows"]) > sources


def committed_merge_metrics(spark: SparkSession, path: str, writer: str) -> dict | None:
    """The metrics of `writer`'s own MERGE (tagged with it alone, deleting nothing) among
    silver's last 50 commits, as a MERGE returns them; None when it is not there."""
    for row in history(spark, path, 50).collect():
        if row["operation"] != "MERGE":
            continue
        done = row["operationMetrics"] or {}
        alone = tagged_slices(row["userMetadata"]) == (writer,)
        if alone and done.get("numTargetRowsDeleted") == "0":
            return {
                "num_updated_rows": done.get("numTargetRowsUpdated", "0"),
                "num_inserted_rows": done.get("numTargetRowsInserted", "0"),
            }
    return None


@dataclass(frozen=True)
class Merged:
    reach: Reach  # the dates the MERGE looked at
    copied: bool  # it may have stored a copy twice (`merge_into_silver`)
    # `slice_ids`' version read just before the lookup of `reach`, where its latest
    # commit was this attempt's own ids (`settle_far_copies` may then reuse the lookup).
    ids_version: int | None = None


def merge_survivors(
    spark: SparkSession,
    settings: Settings,
    kept: DataFrame,
    app_id: str | None,
    writer: str,
    merging: Callable[[], None] = lambda: None,
    attempt: str | None = None,
) -> Merged | None:
    """MERGE a slice's survivors into silver within their reach (their event dates
    widened by the horizon and the far dates of their keys); return that reach (None, and no
    MERGE, when the slice has no valid event). `writer`: the slice whose gate must see
    the rows (the survivors' own). `attempt`: the tag of this attempt's append of the
    survivors' ids; where that append is `slice_ids`' latest commit, its version is
    noted for `settle_far_copies` (the slice's recorded ids are then these keys)."""
    pipeline = settings.pipeline
    span = event_date_span(kept).first()
    if span["first"] is None:
        ensure_silver(spark, settings.table("silver"), pipeline)
        return None
    own = own_reach(span, settings)
    ids_version = None
    if attempt:  # read before the lookup
        latest = latest_commit(spark, settings.table("slice_ids"))
        if attempt in (latest["userMetadata"] or ""):
            ids_version = int(latest["version"])
    reach = reach_of(spark, settings, kept.select(*pipeline.key_columns), own)
    if found := sorted(set(reach.far) - set(own.far)):
        log.warning(
            "keys of this slice have copies in other slices dated %s, beyond its own dates %s: "
            "the MERGE reads those dates too",
            ", ".join(d.isoformat() for d in found),
            own.describe(),
        )
    copied = merge_into_silver(
        spark,
        settings.table("silver"),
        pipeline,
        conform(kept, silver_schema(pipeline)),
        reach,
        app_id,
        writer,
        merging,
        sources=int(span["rows"]),
    )
    return Merged(reach, copied, ids_version)


def withdraw(
    spark: SparkSession, settings: Settings, sl: Slice, keys: DataFrame, dates: Reach
) -> None:
    """Delete silver's rows of `keys` (with their stored `event_date`s in `dates`) whose
    surviving copy came from the slice `sl`: records its replay now quarantines. A row
    whose copy came from another slice stays (that copy is still valid there)."""
    pipeline, path = settings.pipeline, settings.table("silver")
    mine = " OR ".join(
        f"(t.kafka_partition = {p} AND t.kafka_offset >= {a} AND t.kafka_offset < {b})"
        for p, (a, b) in sorted(sl.ranges.items())
        if a < b
    )
    if not mine:
        return
    source = f"withdrawn_{uuid.uuid4().hex}"
    keys.createOrReplaceTempView(source)
    try:
        with commit_tag(spark, slice_tag([sl.slice_id])):
            spark.sql(
                f"MERGE INTO {delta_ref(path)} AS t USING {source} AS s "
                f"ON {dates.sql('t.event_date')} AND {key_match_sql(pipeline)} AND ({mine}) "
                "WHEN MATCHED THEN DELETE"
            ).collect()
    finally:
        spark.catalog.dropTempView(source)


def settle_far_copies(
    spark: SparkSession, settings: Settings, slice_id: str, merged: Merged | None
) -> Reach | None:
    """After the MERGE (`merged`; None: no valid event), the slice's far dates looked up
    again; where there are any, or where the MERGE may have stored a copy twice, each of
    the slice's keys keeps only its survivor's row in the reach. The reach now.

    Of two slices with copies of a key far apart, the one that looks up later finds the
    other's date (each records its ids before its lookup), but the other's MERGE, which
    never read that date, may commit after it: neither wrote what the other read, so
    Delta sees no conflict, and the key has two rows. The later committer's lookup here
    finds the other's date. Wherever far dates exist the rows are checked, whatever
    this attempt's MERGE read: a retry's MERGE may be the first attempt's, skipped by
    Delta. A third slice whose copy beats both rows before either is cleaned up stores
    its copy on both (`merge_into_silver`), so the clean-up keeps one row of the copy
    (`keep_one`), not none. It is tagged with each slice, this one or another holding a
    row of such a key, whose gate has not passed: its gate, pinned at its own last
    commit, may have seen the two rows, and must see the one now. One whose gate passed
    saw one row, and the clean-up adds none: tagged, it would hold every later
    publication for a gate nobody runs again (this slice's own, when this attempt is a
    zombie finishing after its retry's gate; the protocol model's
    `settle_tags_unproved`). Almost always there is no far date and no copy stored
    twice: one lookup and nothing else.

    Where this attempt recorded the slice's ids and no slice recorded any since the
    MERGE's own lookup (`slice_ids` at the version read before it), a lookup now finds
    what that one found: it is reused (the model's `settle_reuses_lookup`). Silver's
    version for the record is read before this check, so a slice that recorded ids
    after the first lookup and then committed to silver at or below that version
    changed `slice_ids` first, and sends this to a lookup."""
    if merged is None:
        return None
    pipeline = settings.pipeline
    key = list(pipeline.key_columns)
    keys = recorded_ids(spark, settings, slice_id).select(*key)
    unchanged = merged.ids_version is not None and merged.ids_version == table_version(
        spark, settings.table("slice_ids")
    )
    # Looked up again from the MERGE's reach: its own dates and the far dates found then.
    reach = merged.reach if unchanged else reach_of(spark, settings, keys, merged.reach)
    if not reach.far and not merged.copied:
        return reach
    rows = silver_window(spark, settings, reach).join(keys, key, "left_semi")
    duplicates = duplicated(rows, pipeline)
    found = duplicates.select("slice_id").collect()
    if not found:
        return reach
    ledger = Ledger.of(settings)
    unproved = [
        o
        for o in {slice_id, *(r.slice_id for r in found)}
        if not (ledger.step(o, "gate") or {}).get("success")
    ]
    log.warning(
        "silver of %s: %d row(s) of keys stored twice (copies far apart, by slices racing "
        "it); keeping each key's survivor once",
        slice_id,
        len(found),
    )
    with commit_tag(spark, slice_tag(unproved)):
        keep_one(spark, settings.table("silver"), pipeline, reach, duplicates)
    return reach


def keep_one(
    spark: SparkSession, path: str, pipeline: Pipeline, reach: Reach, duplicates: DataFrame
) -> None:
    """One MERGE: the rows of keys stored twice (`duplicates`, from
    `transforms.duplicated`) are deleted, and each key's survivor among them is written
    back once. The rows go from silver to the MERGE inside Spark, values untouched.

    Deleting only the beaten rows by Kafka position is not enough: two rows may be the
    same copy, and its position then names both. Rows stored since `duplicates` was
    read (their positions unseen) stay, unless the survivor beats them: then the
    survivor replaces them, as a MERGE of it would. Delta fails the commit if another
    writer changed the reach meanwhile, and the step's retry reads again."""
    columns = [f.name for f in silver_schema(pipeline).fields]
    view = f"kept_once_{uuid.uuid4().hex}"
    kept_once(duplicates, pipeline, columns).createOrReplaceTempView(view)
    position = "concat_ws(':', t.kafka_partition, t.kafka_offset)"
    quoted = ", ".join(f"`{c}`" for c in columns)
    try:
        spark.sql(
            f"MERGE INTO {delta_ref(path)} AS t USING {view} AS s "
            f"ON {reach.sql('t.event_date')} AND {key_match_sql(pipeline)} AND ("
            "(s._op = 'delete' AND t.kafka_partition = s.kafka_partition "
            "AND t.kafka_offset = s.kafka_offset) "
            f"OR (s._op = 'keep' AND NOT array_contains(s._seen, {position}))) "
            "WHEN MATCHED AND s._op = 'delete' THEN DELETE "
            f"WHEN MATCHED AND s._op = 'keep' AND {beats_sql(pipeline)} THEN UPDATE SET "
            + ", ".join(f"`{c}` = s.`{c}`" for c in columns)
            + f" WHEN NOT MATCHED AND s._op = 'keep' THEN INSERT ({quoted}) VALUES ("
            + ", ".join(f"s.`{c}`" for c in columns)
            + ")"
        ).collect()
    finally:
        spark.catalog.dropTempView(view)


# Writes a slice's rows of a table it owns by slice (quarantine, slice_ids): (rows, table).
SliceStore = Callable[[DataFrame, str], None]


def write_slice(
    spark: SparkSession,
    settings: Settings,
    slice_id: str,
    parsed: DataFrame,
    store: SliceStore,
    merge_id: str | None,
    quarantine_last: bool = False,
    attempt: str | None = None,
) -> Merged | None:
    """Quarantine, `slice_ids` and the MERGE from the slice's `parsed` rows (cached by the
    caller, unpersisted here once written); the MERGE's reach (None: no valid event).
    `attempt`: the tag `store`'s commits carry in their userMetadata, if any.

    Quarantine runs beside `slice_ids` then the MERGE: the ids commit first, since
    they are the key index the MERGE of a slice racing with this one looks up
    (`windows.far_dates`). `store` writes the
    slice's rows of quarantine and `slice_ids`: silver appends them once, replay
    replaces them; `merge_id` is the MERGE's idempotent-write id (`merge_into_silver`).
    A store that replaces takes records out of quarantine, so it passes
    `quarantine_last`: quarantine is written only once `slice_ids` and silver hold its
    now-valid records. Cut off before that, they are still in quarantine (the counts
    do not reconcile until the rerun), never in neither."""
    pipeline = settings.pipeline
    # Write-audit-publish: silver may hold the slice's rows before its gate proves them.
    # Each of its commits names the slice (`commits.slice_tag`), and no publication reads
    # a version holding a commit its slice's gate has not seen (`publish`).
    # Cached: the ids, the span and the MERGE all read the survivors.
    kept = survivors(valid_events(parsed, pipeline), pipeline).cache()

    def quarantine() -> None:
        store(quarantined(parsed), "quarantine")
        fault_point("silver.quarantined", settings, slice_id)

    def ids_then_merge() -> Merged | None:
        store(slice_ids(kept, pipeline), "slice_ids")
        return merge_survivors(
            spark,
            settings,
            kept,
            merge_id,
            slice_id,
            lambda: fault_point("silver.merging", settings, slice_id),
            attempt,
        )

    try:
        if quarantine_last:
            merged = ids_then_merge()
            quarantine()
        else:
            _, merged = side_by_side(quarantine, ids_then_merge)
    finally:
        parsed.unpersist()
        kept.unpersist()
    return merged


@dataclass(frozen=True)
class SilverResult:
    slice_id: str
    reach: Reach | None  # event dates the MERGE looked at; None: no valid event


def run_silver(spark: SparkSession, settings: Settings, slice_id: str) -> SilverResult:
    """Parse the slice's bronze rows, quarantine the bad ones, MERGE the rest.

    Silver does not count: the gate computes the slice's counts from the tables
    (`gate_facts.slice_facts`), the same on every rerun, and records them."""
    return retry_on_conflict(
        lambda: silver_from_bronze(spark, settings, slice_id), f"silver of {slice_id}"
    )


def silver_from_bronze(spark: SparkSession, settings: Settings, slice_id: str) -> SilverResult:
    """Silver of a slice that bronze holds: never Kafka, which may have deleted it since."""
    ledger = Ledger.of(settings)
    sl = ledger.load_slice(slice_id)
    return merge_slice(spark, settings, ledger, sl, parsed_slice(spark, settings, slice_id))


def merge_slice(
    spark: SparkSession, settings: Settings, ledger: Ledger, sl: Slice, parsed: DataFrame
) -> SilverResult:
    """Silver's writes of the slice's `parsed` rows (`write_slice`), then record silver.

    Each write appends once under its own idempotent-write id, so a retry ends the same
    whether the rows came from bronze or from the one Kafka read of `ingest`, and
    whichever of them had committed."""
    slice_id = sl.slice_id
    attempt = uuid.uuid4().hex  # finds this attempt's own append of the ids (`merge_survivors`)
    metadata = {"step": "silver", "slice_id": slice_id, "attempt": attempt}
    schemas = {"quarantine": QUARANTINE, "slice_ids": slice_ids_schema(settings.pipeline)}
    forgotten = ids_may_be_forgotten(
        sl.end, settings.pipeline.maintenance.vacuum_retain, settings.step_timeout
    )

    def append(rows: DataFrame, table: str) -> None:
        app_id = f"slicewise/{table}/{slice_id}"
        path = settings.table(table)
        append_slice_once(rows, path, schemas[table], slice_id, app_id, metadata, forgotten)

    merged = write_slice(
        spark,
        settings,
        slice_id,
        parsed,
        append,
        merge_id=f"slicewise/silver/{slice_id}",
        attempt=attempt,
    )
    fault_point("silver.merged", settings, slice_id)
    # Read before the far dates are looked up again: every commit at or below it came
    # before that lookup, so a gate validating silver at or below it may prove the reach
    # recorded here instead of looking it up again (`gate.recorded_reach`).
    version = table_version(spark, settings.table("silver"))
    reach = settle_far_copies(spark, settings, slice_id, merged)

    result = SilverResult(slice_id, reach)
    ledger.record_step(
        slice_id,
        "silver",
        {
            **(reach.record() if reach else {"window": None, "far_dates": []}),
            "silver_version": version,  # at or above its MERGE's
            "reach_looked_up_after": version,
        },
    )
    where = "no valid event" if reach is None else reach.describe()
    log.info("silver %s: merged events of %s", sl.describe(), where)
    return result
