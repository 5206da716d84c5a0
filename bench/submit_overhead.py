"""Wall time of each step as Airflow runs it (one `spark-submit` per step) for one small slice,
under driver JVM option variants, side by side in one run.

    .venv/bin/python bench/submit_overhead.py                 # every variant, 300 records
    .venv/bin/python bench/submit_overhead.py default c1 --records 1000

For a slice this small almost all of a step is fixed cost: JVM start, Python imports
in the driver, Delta and Spark warming up. Starts its own broker on free ports and
a throwaway lakehouse per variant.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from slicewise.config import load_settings
from slicewise.home import REPO_ROOT
from slicewise.ledger import STEPS as LEDGER_STEPS
from slicewise.planner import plan_slice
from slicewise.spark import spark_conf
from slicewise_dev.airflow_env import VENV_BIN
from slicewise_dev.broker import running_broker
from slicewise_dev.source import Faults, produce

VARIANTS = {
    "default": "",
    "c1": "-XX:TieredStopAtLevel=1",  # C1 JIT only: less compile work, slower peak code
    "serial-gc": "-XX:+UseSerialGC",
}
STEPS = LEDGER_STEPS[1:]  # the Spark steps: everything after plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", help=f"some of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--records", type=int, default=300)
    args = parser.parse_args()
    args.variants = args.variants or list(VARIANTS)
    if unknown := set(args.variants) - set(VARIANTS):
        parser.error(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    root = Path(tempfile.mkdtemp(prefix="slicewise-overhead-"))
    start = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(
        minute=0, second=0, microsecond=0
    )
    with running_broker(root / "kafka") as broker:
        env = {"SLICEWISE_KAFKA_BOOTSTRAP": broker.bootstrap, "SLICEWISE_TOPIC": "overhead"}
        produce(load_settings(env), start, 1, args.records, Faults(0, 0, 0, 0))
        print(f"{args.records} records; seconds per spark-submit (local[2])")
        print(f"{'variant':10}" + "".join(f"{s:>9}" for s in STEPS) + f"{'total':>9}")
        for name in args.variants:
            env = {
                **os.environ,
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "SLICEWISE_KAFKA_BOOTSTRAP": broker.bootstrap,
                "SLICEWISE_STATE_DIR": str(root / name),
                "SLICEWISE_TOPIC": "overhead",
            }
            settings = load_settings(env)
            slice_id = plan_slice(settings, start, start + timedelta(hours=1)).slice_id
            times = []
            for step in STEPS:
                cmd = [str(VENV_BIN / "spark-submit"), "--master", "local[2]"]
                for key, value in spark_conf(settings).items():
                    cmd += ["--conf", f"{key}={value}"]
                if VARIANTS[name]:
                    cmd += ["--conf", f"spark.driver.extraJavaOptions={VARIANTS[name]}"]
                cmd += [str(REPO_ROOT / "spark_jobs" / f"{step}.py"), "--slice-id", slice_id]
                began = time.monotonic()
                out = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"{name} {step} failed:\n{out.stderr[-3000:]}")
                times.append(time.monotonic() - began)
            print(f"{name:10}" + "".join(f"{t:9.1f}" for t in times) + f"{sum(times):9.1f}")


if __name__ == "__main__":
    main()
