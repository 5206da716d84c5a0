"""W1 or W1+ as teams schedule them: the bench's AvailableNow job (`workloads.w1_once` or
`w1plus_once`, the same code the bench runs in process) as one spark-submit
application, started by the one task of a DAG of `bench/dags/bench_w1.py`. Prints
`RESULT <json>` like the other workloads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyspark.sql import SparkSession
from workloads import w1_once, w1plus_once  # bench/, where spark-submit runs this from

from slicewise.config import load_settings

JOBS = {"w1": w1_once, "w1plus": w1plus_once}


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench/w1_job.py")
    parser.add_argument("--root", required=True, help="folder of this run's tables")
    parser.add_argument("--workload", choices=JOBS, default="w1")
    args = parser.parse_args()
    spark = SparkSession.builder.appName(f"bench-{args.workload}").getOrCreate()  # its settings
    result = JOBS[args.workload](spark, load_settings(), Path(args.root))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
