"""W1 as teams schedule it: the bench's AvailableNow job (`workloads.w1_once`, the same
code W1 runs) as one spark-submit application, started by the one task of
`bench/dags/bench_w1.py`. Prints `RESULT <json>` like the other workloads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyspark.sql import SparkSession
from workloads import w1_once  # bench/, where spark-submit runs this script from

from slicewise.config import load_settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench/w1_job.py")
    parser.add_argument("--root", required=True, help="folder of this run's bronze and silver")
    args = parser.parse_args()
    spark = SparkSession.builder.appName("bench-w1").getOrCreate()  # spark-submit's settings
    result = w1_once(spark, load_settings(), Path(args.root))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
