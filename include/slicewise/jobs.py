"""Spark entry points shared by `spark_jobs/*.py` (spark-submit) and the CLI.

They only parse arguments, get the session from the one factory, and call the
step. Each prints one JSON line with its outcome, which ends up in the Airflow
task log.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any

from pyspark.sql import SparkSession

from slicewise.config import Settings, load_settings
from slicewise.spark import get_spark, ship_package, size_for_slices


def _bronze(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.bronze import run_bronze

    return run_bronze(spark, settings, args.slice_id, accept_data_loss=args.accept_data_loss)


def _silver(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.silver import run_silver

    return run_silver(spark, settings, args.slice_id)


def _gate(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.gate import run_gate

    return run_gate(spark, settings, args.slice_id)


def _publish(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.publish import run_publish

    return run_publish(spark, settings, args.slice_id)


def _replay(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.replay import run_replay

    return run_replay(spark, settings, args.slice_id)


STEPS: dict[str, Callable[[SparkSession, Settings, argparse.Namespace], Any]] = {
    "bronze": _bronze,
    "silver": _silver,
    "gate": _gate,
    "publish": _publish,
    "replay-quarantine": _replay,
}


def step_parser(
    step: str, parser: argparse.ArgumentParser | None = None
) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog=f"spark_jobs/{step}.py")
    parser.add_argument(
        "--slice-id", required=True, help="slice to process, e.g. 20261122T030000Z-20261122T040000Z"
    )
    if step == "bronze":
        parser.add_argument(
            "--accept-data-loss",
            nargs="?",
            const="true",
            default="false",
            type=lambda v: v.lower() in ("true", "1", "yes"),
            help="ingest what Kafka still retains when part of the slice was deleted (logged)",
        )
    return parser


def run(step: str, args: argparse.Namespace, master: str | None = None) -> Any:
    settings = load_settings()
    spark = get_spark(f"slicewise-{step}-{args.slice_id}", master=master, settings=settings)
    size_for_slices(spark)
    ship_package(spark, settings)
    result = STEPS[step](spark, settings, args)
    print(
        json.dumps(
            {
                "step": step,
                "slice_id": args.slice_id,
                "result": asdict(result) if is_dataclass(result) else result,
            },
            default=str,
        )
    )
    return result


def main(step: str, argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(step, step_parser(step).parse_args(argv))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1], sys.argv[2:]))
