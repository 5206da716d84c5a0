"""Schema evolution of a pipeline's definition against real Delta tables: a new optional
field adds a silver column without rewriting a file; a changed declared type is refused
naming the field; a record whose field changed type is quarantined (docs/PIPELINES.md)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pyspark.sql import functions as F
from test_core import LATER, at, table  # same folder, on sys.path under pytest

from slicewise.bronze import run_bronze
from slicewise.gate_facts import slice_counts
from slicewise.pipelines import FieldSpec
from slicewise.planner import plan_slice
from slicewise.silver import SchemaChangeRefused, run_silver
from slicewise.tables import history
from slicewise_dev.producer import Record

pytestmark = pytest.mark.integration


def value(event_id: str, hours: float, **extra) -> bytes:
    doc = {
        "event_id": event_id,
        "event_type": "click",
        "occurred_at": at(hours).isoformat().replace("+00:00", "Z"),
        **extra,
    }
    return json.dumps(doc).encode()


def with_field(settings, name: str, spec: FieldSpec):
    """The settings with one more field in their pipeline's definition."""
    pipeline = settings.pipeline.model_copy(
        update={"fields": {**settings.pipeline.fields, name: spec}}
    )
    return dataclasses.replace(settings, pipeline=pipeline)


def run(spark, settings, start: float):
    sl = plan_slice(settings, at(start), at(start + 1), now=LATER)
    run_bronze(spark, settings, sl.slice_id)
    run_silver(spark, settings, sl.slice_id)
    return sl


def test_a_new_optional_field_adds_a_column_and_a_changed_type_is_refused(spark, pipeline):
    settings, producer = pipeline
    producer.send(
        [Record(value(f"a{i}", 0.5, channel="web"), i % 3, at(0.5)) for i in range(6)]
        + [Record(value(f"b{i}", 1.5, channel="app"), i % 3, at(1.5)) for i in range(6)]
        + [Record(value("b-bad", 1.6, channel=7), 0, at(1.6))]
    )
    first = run(spark, settings, 0)
    silver = table(spark, settings, "silver")
    assert "channel" not in silver.columns  # undeclared fields are ignored
    files_before = {r.f for r in silver.select(F.input_file_name().alias("f")).distinct().collect()}

    # The definition gains an optional field: the next slice adds the column, no rewrite.
    evolved = with_field(settings, "channel", FieldSpec(type="string"))
    second = run(spark, evolved, 1)
    silver = table(spark, evolved, "silver")
    assert "channel" in silver.columns
    by_slice = {
        (r.slice_id, r.channel): r.n
        for r in silver.groupBy("slice_id", "channel").agg(F.count("*").alias("n")).collect()
    }
    assert by_slice == {(first.slice_id, None): 6, (second.slice_id, "app"): 6}
    old_rows_files = {
        r.f
        for r in silver.where(F.col("slice_id") == first.slice_id)
        .select(F.input_file_name().alias("f"))
        .distinct()
        .collect()
    }
    assert old_rows_files == files_before  # the first slice's files were not rewritten
    operations = [r.operation for r in history(spark, evolved.table("silver"), 10).collect()]
    assert "ADD COLUMNS" in operations, operations
    # A record whose field has another type than declared is quarantined, not coerced.
    reasons = {
        r.value: r.reason
        for r in table(spark, evolved, "quarantine")
        .where(F.col("slice_id") == second.slice_id)
        .collect()
    }
    assert reasons == {value("b-bad", 1.6, channel=7): "wrong_type:channel"}
    assert slice_counts(spark, evolved, second.slice_id).reconciles

    # The declared type changes: refused at the next silver run, naming the field.
    retyped = with_field(settings, "channel", FieldSpec(type="integer"))
    with pytest.raises(SchemaChangeRefused, match=r"silver's column `channel` is string"):
        run_silver(spark, retyped, second.slice_id)
