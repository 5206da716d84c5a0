"""OpenLineage for the steps: what each one read and wrote, named as OpenLineage's naming
spec names Kafka topics and tables on a file system or an object store, with the counts
the ledger holds, the gate's checks as data-quality assertions, and the slice.

Airflow's OpenLineage provider asks an operator for this after its task succeeded
(`get_openlineage_facets_on_complete`); without a configured transport the provider
sends nothing, and nothing here runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import Dataset, InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    InputDatasetFacet,
    RunFacet,
    data_quality_assertions_dataset,
    data_quality_metrics_input_dataset,
    output_statistics_output_dataset,
)

from slicewise.config import Settings
from slicewise.ledger import Ledger

# Our own facets' schema: a name, not a document (docs/DEPLOYING.md describes them).
SCHEMA = "urn:slicewise:openlineage:facets:1"
# OpenLineage names an object store's datasets by its own scheme, not Hadoop's.
SCHEMES = {"s3a": "s3", "s3n": "s3", "s3": "s3", "gs": "gs", "abfss": "abfss", "abfs": "abfss"}


@attr.define
class SliceRunFacet(RunFacet):
    """The slice a step ran on: its interval and its offsets per partition."""

    pipeline: str
    sliceId: str
    start: str
    end: str
    ranges: dict[str, list[int]]

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA}#slicerunfacet"


@attr.define
class OffsetRangesFacet(InputDatasetFacet):
    """The offsets a step read of a Kafka topic, per partition: [from, until)."""

    ranges: dict[str, list[int]]

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA}#offsetrangesfacet"


def table_dataset(location: str) -> tuple[str, str]:
    """(namespace, name) of a table's location, as OpenLineage's naming spec writes them."""
    scheme, sep, rest = location.partition("://")
    if not sep or scheme == "file":
        return "file", str(Path("/" + rest.lstrip("/") if sep else location).resolve())
    where, _, path = rest.partition("/")
    return f"{SCHEMES.get(scheme, scheme)}://{where}", path.rstrip("/")


def kafka_dataset(settings: Settings) -> tuple[str, str]:
    """(namespace, name) of the topic: the first bootstrap server names the cluster."""
    return f"kafka://{settings.bootstrap_servers.split(',')[0].strip()}", settings.topic


def step_lineage(settings: Settings, step: str, slice_id: str) -> OperatorLineage:
    """What the step read and wrote for the slice, from the ledger's records."""
    ledger = Ledger.of(settings)
    sl = ledger.load_slice(slice_id)
    ranges = {str(p): [a, b] for p, (a, b) in sorted(sl.ranges.items())}
    gate = ledger.step(slice_id, "gate") or {}
    counts = gate.get("counts") or {}
    bronze_rows = (ledger.step(slice_id, "bronze") or {}).get("rows")

    def table(name: str, rows: int | None = None, output: bool = False) -> Any:
        """A table read or written; its row count when the ledger holds one."""
        namespace, path = table_dataset(settings.table(name))
        if output:
            stats = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet
            facets = {} if rows is None else {"outputStatistics": stats(rowCount=rows)}
            return OutputDataset(namespace, path, outputFacets=facets)
        metrics = data_quality_metrics_input_dataset.DataQualityMetricsInputDatasetFacet
        facets = {} if rows is None else {"dataQualityMetrics": metrics({}, rowCount=rows)}
        return InputDataset(namespace, path, inputFacets=facets)

    if step == "ingest":
        namespace, topic = kafka_dataset(settings)
        inputs: list[Dataset] = [
            InputDataset(namespace, topic, inputFacets={"offsetRanges": OffsetRangesFacet(ranges)})
        ]
        outputs: list[Dataset] = [table("bronze", bronze_rows, output=True)] + [
            table(name, output=True) for name in ("silver", "quarantine", "slice_ids")
        ]
    elif step == "gate":
        inputs = [
            table("bronze", counts.get("read")),
            table("quarantine", counts.get("quarantined")),
            table("slice_ids"),
            _checked_silver(settings, gate, counts),
        ]
        outputs = []
    elif step == "publish":
        inputs = [table("silver")]
        outputs = [table("gold_events_per_hour", output=True)] if settings.pipeline.gold else []
    else:  # the DAG's tasks are the steps above; the CLI's other steps report nothing
        inputs, outputs = [], []
    facet = SliceRunFacet(
        pipeline=settings.pipeline.name,
        sliceId=sl.slice_id,
        start=sl.start.isoformat(),
        end=sl.end.isoformat(),
        ranges=ranges,
    )
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets={"slicewise_slice": facet})


def _checked_silver(settings: Settings, gate: dict, counts: dict) -> InputDataset:
    """Silver as the gate read it: what it proved, each check an assertion."""
    namespace, path = table_dataset(settings.table("silver"))
    checks = [
        ("no duplicate keys in the slice's silver rows", counts.get("duplicates_in_silver") == 0),
        ("every valid event of the slice is in silver", counts.get("missing") == 0),
        ("the gate passed", bool(gate.get("success"))),
    ]
    assertions = data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(
        assertions=[
            data_quality_assertions_dataset.Assertion(assertion=name, success=ok)
            for name, ok in checks
        ]
    )
    metrics = data_quality_metrics_input_dataset.DataQualityMetricsInputDatasetFacet(
        columnMetrics={}, rowCount=counts.get("inserted")
    )
    return InputDataset(
        namespace,
        path,
        facets={"dataQualityAssertions": assertions},
        inputFacets={"dataQualityMetrics": metrics},
    )
