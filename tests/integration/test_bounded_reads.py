"""A slice's reads of each table's Delta log do not grow with the slices before it.

The steps read a log three ways: Delta's snapshot (the last checkpoint and the commits
after it), `DESCRIBE HISTORY ... LIMIT n` above a version already proved (`commits`,
the key index's tail), and the idempotent-write ids a checkpoint carries. Counted by
the kernel (`FileOpens`), so the Spark Connect server's reads count too: the distinct
files a whole slice (ingest, gate, publish) opens in each `_delta_log`, early and after a
thousand earlier commits to every table.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from slicewise.gate import run_gate
from slicewise.ingest import run_ingest
from slicewise.planner import plan_slice
from slicewise.publish import run_publish
from slicewise.slices import stamp
from slicewise.tables import table_properties, table_version
from slicewise_dev.file_opens import FileOpens
from slicewise_dev.producer import Record, event_value

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
MINUTE = timedelta(minutes=1)
LATER = datetime.now(timezone.utc) + timedelta(days=1)
TABLES = ("bronze", "quarantine", "slice_ids", "silver", "gold_events_per_hour")
EARLIER = 1_000  # commits added to every table's log between the two slices measured
HISTORY_WINDOW = 50  # the most commits back a step reads (`tables.tagged_commit`'s)


def run_slice(spark, settings, producer, minute: int) -> None:
    start = T0 + minute * MINUTE
    producer.send(
        [Record(event_value(f"m{minute}-{i}", start + i * MINUTE / 20), i % 3, start)
         for i in range(20)]
        + [Record(b"not json", 0, start)]  # a quarantined record: quarantine commits too
    )  # fmt: skip
    sl = plan_slice(settings, start, start + MINUTE, now=LATER)
    run_ingest(spark, settings, sl.slice_id)
    assert run_gate(spark, settings, sl.slice_id)["success"]
    run_publish(spark, settings, sl.slice_id)


def add_earlier_commits(spark, log: Path, table: str, path: str) -> None:
    """At least EARLIER commits that change no row, each spending one idempotent-write id
    as a slice's write does, written by hand; so many that the next commit to the table
    is one Delta checkpoints at (as every `checkpointInterval`-th of a real history)."""
    interval = int(table_properties(spark, path).get("delta.checkpointInterval", "10"))
    version = table_version(spark, path)
    last = version + EARLIER
    last += (interval - 1 - last) % interval  # the next commit, last + 1, checkpoints
    now = int(time.time() * 1000)
    for v in range(version + 1, last + 1):
        fake = f"{stamp(T0 - v * MINUTE)}-{stamp(T0 - (v - 1) * MINUTE)}"
        actions = [
            {"commitInfo": {"timestamp": now, "operation": "SET TBLPROPERTIES",
                            "operationParameters": {}}},
            {"txn": {"appId": f"slicewise/{table}/{fake}", "version": 0, "lastUpdated": now}},
        ]  # fmt: skip
        (log / f"{v:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def test_a_slice_opens_as_many_log_files_after_a_thousand_commits_as_early(spark, pipeline):
    settings, producer = pipeline
    logs = {name: Path(settings.table(name)) / "_delta_log" for name in TABLES}

    def slice_opens(minute: int) -> dict[str, int]:
        with FileOpens(list(logs.values())) as opens:
            run_slice(spark, settings, producer, minute)
        return {name: opens.count(log, (".json", ".parquet", ".crc")) for name, log in logs.items()}

    run_slice(spark, settings, producer, 0)  # creates the tables
    early = slice_opens(1)
    for name, log in logs.items():
        add_earlier_commits(spark, log, name, settings.table(name))
    run_slice(spark, settings, producer, 2)  # the first commit after them checkpoints
    for name, log in logs.items():
        assert any(p.name.endswith(".checkpoint.parquet") for p in log.iterdir()), name
    late = slice_opens(3)
    print(f"log files a slice opens, early: {early}; after {EARLIER} commits: {late}")
    for name in TABLES:
        assert early[name] > 0, name  # the counter sees the server's reads
        # A thousand commits more to read would show as a thousand files. Bounded: the
        # checkpoint, the few commits since it, and history reads of at most the last
        # HISTORY_WINDOW commits (early on, the table had only a few to read).
        assert late[name] <= early[name] + HISTORY_WINDOW + 10, (name, early[name], late[name])
