"""Spark entry points shared by `spark_jobs/*.py` (spark-submit), the Spark Connect
operator and the CLI.

They only parse arguments, get the session from the one factory (or take the one
the operator opened), and call the step. Each prints one JSON line with its
outcome, which ends up in the Airflow task log.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any

from pyspark.sql import SparkSession

from slicewise.config import Settings, load_settings
from slicewise.spark import CONNECT_SWITCHES, get_spark, is_remote, ship_package, size_for_slices


def _ingest(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    if args.reprocess_from_bronze:
        return _replay(spark, settings, args)
    from slicewise.ingest import run_ingest

    return run_ingest(spark, settings, args.slice_id, accept_data_loss=args.accept_data_loss)


def _bronze(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.bronze import run_bronze

    return run_bronze(spark, settings, args.slice_id, accept_data_loss=args.accept_data_loss)


def _silver(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    if args.reprocess_from_bronze:
        return _replay(spark, settings, args)
    from slicewise.silver import run_silver

    return run_silver(spark, settings, args.slice_id)


def _gate(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.gate import run_gate

    return run_gate(spark, settings, args.slice_id)


def _publish(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.publish import run_publish

    return run_publish(spark, settings, args.slice_id, args.accept_truncated_history)


def _replay(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.replay import run_replay

    return run_replay(spark, settings, args.slice_id)


def _maintain(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> Any:
    from slicewise.maintenance import run_maintenance

    return run_maintenance(spark, settings)


STEPS: dict[str, Callable[[SparkSession, Settings, argparse.Namespace], Any]] = {
    "ingest": _ingest,
    "bronze": _bronze,
    "silver": _silver,
    "gate": _gate,
    "publish": _publish,
    "replay-quarantine": _replay,
    "maintain": _maintain,
}
# Steps of the whole pipeline rather than of one slice.
PIPELINE_STEPS = ("maintain",)


def step_parser(
    step: str, parser: argparse.ArgumentParser | None = None
) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog=f"spark_jobs/{step}.py")
    if step in PIPELINE_STEPS:
        parser.set_defaults(slice_id=None)
    else:
        parser.add_argument(
            "--slice-id",
            required=True,
            help="slice to process, e.g. 20261122T030000Z-20261122T040000Z",
        )
    add_pipeline_arg(parser)
    for name, help_text in STEP_FLAGS.get(step, {}).items():
        # `--flag`, `--flag true` or `--flag false`: the DAG renders a param into the value.
        parser.add_argument(
            name, nargs="?", const="true", default="false", type=_flag, help=help_text
        )
    return parser


def add_pipeline_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pipeline",
        default=None,
        help="the pipeline of pipelines.yaml to run (default: SLICEWISE_PIPELINE, else the "
        "file's first)",
    )


ACCEPT_DATA_LOSS = {
    "--accept-data-loss": "ingest what Kafka still retains when part of the slice was "
    "deleted (logged)",
}
REPROCESS_FROM_BRONZE = {
    "--reprocess-from-bronze": "re-parse the slice's bronze rows with today's rules and "
    "replay its quarantine",
}
STEP_FLAGS = {
    "publish": {
        "--accept-truncated-history": "publish though silver's log no longer reaches the "
        "last published version, once every unpublished slice's gate passed (logged)"
    },
    "ingest": {**ACCEPT_DATA_LOSS, **REPROCESS_FROM_BRONZE},
    "bronze": ACCEPT_DATA_LOSS,
    "silver": REPROCESS_FROM_BRONZE,
}


def _flag(value: str) -> bool:
    return value.lower() in ("true", "1", "yes")


def step_tag(step: str, scope: str) -> str:
    """The Spark Connect operation tag of one step of one slice, or of a pipeline's
    maintenance (interrupt by tag)."""
    return f"slicewise-{step}-{scope}"


def run(
    step: str,
    args: argparse.Namespace,
    master: str | None = None,
    spark: SparkSession | None = None,
    settings: Settings | None = None,
) -> Any:
    settings = settings or load_settings(pipeline=args.pipeline)
    scope = args.slice_id or settings.pipeline.name  # a slice, or the whole pipeline
    owned = spark is None
    spark = spark or get_spark(f"slicewise-{step}-{scope}", master=master, settings=settings)
    size_for_slices(spark)
    ship_package(spark, settings)
    remote = is_remote(spark)
    if remote:
        spark.addTag(step_tag(step, scope))
    try:
        result = STEPS[step](spark, settings, args)
    finally:
        if remote:
            spark.removeTag(step_tag(step, scope))
            if owned:  # release the server-side session (and its cache) now
                spark.stop()
    print(
        json.dumps(
            {
                "step": step,
                "pipeline": settings.pipeline.name,
                "slice_id": args.slice_id,
                "result": asdict(result) if is_dataclass(result) else result,
            },
            default=str,
        )
    )
    return result


def main(step: str, argv: Sequence[str] | None = None) -> int:
    """The spark-submit entry point: the step runs in this application's own driver,
    whatever SLICEWISE_SPARK_REMOTE says (that is the other mode)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # A parent that opened a Connect session (a test run, an Airflow worker of the other
    # mode) leaves pyspark's connect switches in the environment; this driver is classic.
    for switch in CONNECT_SWITCHES:
        os.environ.pop(switch, None)
    args = step_parser(step).parse_args(argv)
    settings = dataclasses.replace(load_settings(pipeline=args.pipeline), spark_remote=None)
    run(step, args, settings=settings)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1], sys.argv[2:]))
