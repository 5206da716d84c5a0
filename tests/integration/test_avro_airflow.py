"""An Avro stream through Airflow (api-server + scheduler, LocalExecutor) against the real
broker, Spark Connect server, Delta tables and schema registry (Apicurio): the event
source writes the documented Avro pipeline's events (docs/examples/avro-events.yaml),
switching to a new schema version mid-stream, with duplicates, aborted and long-open
transactions and records that break the wire format. Silver must hold exactly the
committed, valid keys of the source's oracle, and quarantine exactly its malformed
records."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import yaml
from pyspark.sql import functions as F

from slicewise.config import load_settings
from slicewise.home import REPO_ROOT
from slicewise_dev.airflow_env import airflow_env
from slicewise_dev.airflow_services import AirflowServices
from slicewise_dev.source import Faults, produce

pytestmark = pytest.mark.integration

EXAMPLE = REPO_ROOT / "docs" / "examples" / "avro-events.yaml"
FAULTS = Faults(duplicate_rate=0.1, aborted_rate=0.3, malformed_rate=0.08, open_transactions=1)


def test_an_avro_stream_that_changes_schema_mid_stream_ends_in_silver_exactly_once(
    pipeline, spark, schema_registry, tmp_path
):
    base, _ = pipeline  # the shared broker and Spark Connect server, a fresh lakehouse
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["pipelines"]["events"]["topic"] = base.topic
    definitions = tmp_path / "pipelines.yaml"
    definitions.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {
        **airflow_env(base),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        # A metadata DB of its own: the test session's (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN)
        # holds other tests' runs of this DAG, and a backfill creates no run for an hour
        # that already has one (seen in CI after the end-to-end test ran these hours).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/airflow.db?timeout=60",
        "SLICEWISE_GRACE_SECONDS": "0",
        "SLICEWISE_PIPELINES_FILE": str(definitions),
        "SLICEWISE_SCHEMA_REGISTRY_URL": schema_registry.url,
    }
    settings = load_settings(env)
    assert settings.pipeline.format == "avro"

    end = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=2)
    oracle = produce(settings, start, 2, 200, FAULTS, seed=11, batch=25, shape="avro-events")
    versions = schema_registry.request("GET", f"/subjects/{settings.schema_subject}/versions")
    assert versions == [1, 2], versions  # version 2 came mid-stream
    assert oracle.malformed and oracle.duplicates_sent and oracle.aborted

    with AirflowServices(env, tmp_path / "logs") as services:
        runs = services.backfill(start, end, until_closed=False)  # the only one
    assert sorted(runs) == [start, start + timedelta(hours=1)]
    assert {r.state for r in runs.values()} == {"success"}, runs

    silver = spark.read.format("delta").load(settings.table("silver"))
    keys = [r.event_id for r in silver.select("event_id").collect()]
    assert len(keys) == len(set(keys)) and set(keys) == oracle.committed_valid
    # Both versions landed in the same columns: version 1's rows read `channel` as null.
    channels = {r.channel for r in silver.select("channel").distinct().collect()}
    assert None in channels and channels - {None} <= {"web", "ios", "android"}, channels
    assert silver.where(F.col("payload").isNull()).count() == 0

    quarantine = spark.read.format("delta").load(settings.table("quarantine"))
    found = {(r.partition, r.offset) for r in quarantine.select("partition", "offset").collect()}
    assert found == oracle.malformed
    reasons = {r.reason for r in quarantine.select("reason").distinct().collect()}
    assert reasons <= {"not_wire_format", "unknown_schema_id", "undecodable", "blank:event_id"}
