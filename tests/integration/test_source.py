"""The event source CLI against the real broker, and the pipeline checked against its oracle."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timedelta, timezone

import pytest

from slicewise.gate_facts import slice_counts
from slicewise.ingest import run_ingest
from slicewise.planner import plan_slice
from slicewise_dev.airflow_env import VENV_BIN
from slicewise_dev.source import Manifest

pytestmark = pytest.mark.integration


def test_silver_and_quarantine_equal_the_oracle_of_a_faulty_stream(spark, pipeline, tmp_path):
    settings, _ = pipeline
    start = (datetime.now(timezone.utc) - timedelta(hours=5)).replace(
        minute=0, second=0, microsecond=0
    )
    oracle = tmp_path / "oracle.json"
    env = {
        **os.environ,
        "SLICEWISE_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "SLICEWISE_TOPIC": settings.topic,
        "SLICEWISE_STATE_DIR": str(settings.state_dir),
        "SLICEWISE_LAKEHOUSE": settings.lakehouse,
    }
    args = [
        "--start", start.isoformat(), "--intervals", "2", "--events", "400",
        "--duplicate-rate", "0.1", "--aborted-rate", "0.2", "--malformed-rate", "0.05",
        "--open-transactions", "1", "--skew-minutes", "20", "--drift-rate", "0.05", "--seed", "2",
        "--manifest", str(oracle),
    ]  # fmt: skip
    out = subprocess.run(
        [str(VENV_BIN / "slicewise-produce"), *args], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "committed valid events" in out.stdout
    manifest = Manifest.from_json(oracle.read_text())
    # The faults really happened.
    assert manifest.duplicates_sent and manifest.aborted and manifest.malformed
    assert {e for e in manifest.committed_valid if e.startswith("late-")}

    counts = []
    for k in range(-1, 3):  # skewed timestamps spill into the neighbouring hours
        sl = plan_slice(settings, start + timedelta(hours=k), start + timedelta(hours=k + 1))
        run_ingest(spark, settings, sl.slice_id)  # the DAG's step
        counts.append(slice_counts(spark, settings, sl.slice_id))

    silver = spark.read.format("delta").load(settings.table("silver"))
    ids = [r.event_id for r in silver.select("event_id").collect()]
    assert len(ids) == len(set(ids))  # nothing duplicated
    assert set(ids) == manifest.committed_valid  # nothing lost, nothing aborted
    quarantine = spark.read.format("delta").load(settings.table("quarantine"))
    assert {(r.partition, r.offset) for r in quarantine.collect()} == manifest.malformed
    assert sum(c.quarantined for c in counts) == len(manifest.malformed)
    # Every committed record read once, and each slice's counts add up. (`inserted` may sum
    # to more than the ids: a later copy at a lower Kafka position replaces the survivor.)
    committed_records = len(manifest.committed_valid) + manifest.duplicates_sent
    assert sum(c.read for c in counts) == committed_records + len(manifest.malformed)
    assert all(c.reconciles for c in counts), [c.describe() for c in counts]
