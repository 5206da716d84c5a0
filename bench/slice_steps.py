"""Time each step for one slice of N records on this machine (in-process Spark).

    .venv/bin/python bench/slice_steps.py [N]     # default 100000

Starts its own broker on free ports and a throwaway lakehouse; prints one line
per step. A first measurement for the core issue; the full side-by-side
benchmark harness (W0-W3) is separate work.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from slicewise.bronze import run_bronze
from slicewise.config import load_settings
from slicewise.gate import run_gate
from slicewise.kafka.broker import LocalBroker, free_ports
from slicewise.kafka.producer import Record, TxProducer, ensure_topic, event_value
from slicewise.planner import plan_slice
from slicewise.publish import run_publish
from slicewise.silver import run_silver
from slicewise.spark import get_spark, local_conf


def main(n: int) -> None:
    state = Path(tempfile.mkdtemp(prefix="slicewise-bench-"))
    port, cport = free_ports(2)
    broker = LocalBroker(state, load_settings().cache_dir, port=port, controller_port=cport)
    broker.start(timeout=120)
    try:
        settings = load_settings(
            {
                "SLICEWISE_KAFKA_BOOTSTRAP": broker.bootstrap,
                "SLICEWISE_STATE_DIR": str(state),
                "SLICEWISE_TOPIC": "bench",
            }
        )
        conf = {"bootstrap.servers": broker.bootstrap}
        ensure_topic(conf, "bench", 3)
        start = (datetime.now(UTC) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
        rng = random.Random(1)
        producer = TxProducer(conf, "bench", "bench")
        t = time.monotonic()
        for batch in range(0, n, 10_000):
            records = []
            for i in range(batch, min(n, batch + 10_000)):
                ts = start + timedelta(seconds=rng.randrange(3600))
                eid = (
                    f"e{i}" if rng.random() > 0.01 else f"e{rng.randrange(max(i, 1))}"
                )  # ~1% duplicates
                records.append(Record(event_value(eid, ts, "click", {"i": i}), i % 3, ts))
            producer.send(records)
        print(f"produce   {n} records: {time.monotonic() - t:6.1f}s")
        spark = get_spark(
            "slicewise-bench", master="local[*]", extra_conf=local_conf(), settings=settings
        )
        steps = [
            ("plan", lambda: plan_slice(settings, start, start + timedelta(hours=1))),
            ("bronze", lambda: run_bronze(spark, settings, sid)),
            ("silver", lambda: run_silver(spark, settings, sid)),
            ("gate", lambda: run_gate(spark, settings, sid)),
            ("publish", lambda: run_publish(spark, settings, sid)),
        ]
        sid = f"{start:%Y%m%dT%H%M%SZ}-{start + timedelta(hours=1):%Y%m%dT%H%M%SZ}"
        for name, step in steps:
            t = time.monotonic()
            result = step()
            print(
                f"{name:9} {time.monotonic() - t:6.1f}s  {getattr(result, 'describe', lambda: '')()}"
            )
        spark.stop()
    finally:
        broker.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
