"""`slicewise`: run any step by hand for one slice, and see the ledger.

On-call uses this to inspect and re-run a slice exactly as the DAG would:

    slicewise status                     # the 24 latest slices (--last N, --since, --slice-id)
    slicewise docs --slice-id ...        # a slice's Data Docs, fetched from the lakehouse
    slicewise plan --start 2026-11-22T03:00:00Z --end 2026-11-22T04:00:00Z
    slicewise ingest --slice-id 20261122T030000Z-20261122T040000Z   # bronze + silver
    slicewise gate --slice-id ...     |  publish  |  bronze  |  silver  |  replay-quarantine
    slicewise maintain                   # compact, purge and vacuum the tables (docs/OPERATIONS.md)
    slicewise pipelines                  # check pipelines.yaml, list its pipelines
    slicewise spark-server               # how to start a Spark Connect server of your own
    slicewise class-archive              # once per host or image: steps by hand start faster

Every command takes `--pipeline NAME` (default: SLICEWISE_PIPELINE, else the
definition file's first pipeline). An expected failure (data loss, a held LSO past
its age, a failed gate) prints its message and the safe action and exits 1;
`slicewise --debug ...` shows its traceback too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from slicewise.config import ConfigError, Settings, load_settings
from slicewise.coverage import unowned_ranges
from slicewise.errors import OperationalError
from slicewise.freshness import Freshness, Published, freshness
from slicewise.holds import Hold
from slicewise.jobs import PIPELINE_STEPS, STEPS, add_pipeline_arg, step_parser
from slicewise.kafka.offsets import KafkaUnavailable, TopicOffsets
from slicewise.ledger import STEPS as LEDGER_STEPS
from slicewise.ledger import Ledger
from slicewise.slices import Slice


def instant(text: str) -> datetime:
    """A zoned ISO-8601 time from the command line."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a zone, e.g. 2026-11-22T03:00:00Z")
    return value


def status_rows(ledger: Ledger, shown: list[Slice]) -> list[dict]:
    rows = []
    for sl in shown:
        steps = {
            step: ledger.step(sl.slice_id, step)
            for step in (*LEDGER_STEPS, "replay", "data_loss_ack", "acknowledge")
        }
        counts = (steps.get("gate") or {}).get("counts") or {}  # from the tables, by the gate
        rows.append(
            {
                "slice_id": sl.slice_id,
                "interval": [sl.start.isoformat(), sl.end.isoformat()],
                "ranges": {str(p): list(r) for p, r in sorted(sl.ranges.items())},
                "steps": {
                    k: (v or {}).get("recorded_at", "-")
                    for k, v in steps.items()
                    if k in LEDGER_STEPS
                },
                "counts": {
                    k: counts.get(k)
                    for k in (
                        "read",
                        "quarantined",
                        "duplicates_in_slice",
                        "inserted",
                        "duplicates_in_silver",
                        "missing",
                    )
                },
                "gate": (steps.get("gate") or {}).get("success"),
                # Passing reruns since the first pass; the counts above stay the first's.
                "rechecks": (steps.get("gate") or {}).get("rechecks", []),
                "data_loss_accepted": bool(steps.get("data_loss_ack")),
                # The consumer group after publication (slicewise.acknowledge).
                "acknowledged": steps.get("acknowledge"),
            }
        )
    return rows


def shown_slices(
    ledger: Ledger, last: int, since: datetime | None, slice_id: str | None
) -> list[Slice]:
    """The slices `status` shows: one by id, those since a time, or the latest `last`;
    never a read of the whole history."""
    if slice_id is not None:
        return [ledger.load_slice(slice_id)]
    if since is not None:
        return ledger.latest_slices(sys.maxsize, since=since)
    return ledger.latest_slices(last)


def status_freshness(settings: Settings, ledger: Ledger, rows: list[dict]) -> Freshness:
    """Freshness from the newest boundary and the topic's LSOs (status still answers when
    Kafka does not); the newest publication among the slices shown."""
    try:
        last_stable = TopicOffsets.of(settings, timeout=5.0).last_stable()
    except KafkaUnavailable as exc:
        logging.getLogger(__name__).warning("freshness without the LSOs: %s", exc)
        last_stable = None
    published = [
        Published(
            r["slice_id"],
            datetime.fromisoformat(r["interval"][1]),
            datetime.fromisoformat(r["steps"]["publish"]),
        )
        for r in rows
        if r["steps"]["publish"] != "-"
    ]
    newest = ledger.newest_boundary()
    return freshness([newest] if newest else [], last_stable, published)


def print_holds(holds: list[Hold], now: datetime) -> None:
    """Partitions an open transaction held back at the latest plan: slices stop short there."""
    for hold in holds:
        print(f"HELD {hold.describe(now)} (as of the latest plan)")


def print_status(rows: list[dict]) -> None:
    if not rows:
        print("no slices planned yet")
        return
    print(
        f"{'slice':34} {'offsets per partition':36} {'steps done':28} {'read':>6} {'quar':>5} "
        f"{'dupS':>5} {'ins':>6} {'dupX':>5} gate"
    )
    for r in rows:
        offsets = " ".join(f"p{p}:{a}-{b}" for p, (a, b) in r["ranges"].items())
        done = ",".join(s for s, at in r["steps"].items() if at != "-")
        c = r["counts"]
        gate = {True: "pass", False: "FAIL", None: "-"}[r["gate"]]
        print(
            f"{r['slice_id']:34} {offsets[:36]:36} {done:28} {c['read'] or '-':>6} {c['quarantined'] or 0:>5} "
            f"{c['duplicates_in_slice'] or 0:>5} {c['inserted'] or 0:>6} {c['duplicates_in_silver'] or 0:>5} "
            f"{gate}{'  DATA LOSS ACCEPTED' if r['data_loss_accepted'] else ''}"
            f"{_rechecked(r['rechecks'])}"
        )
        warning = (r["acknowledged"] or {}).get("warning")
        if warning:
            print(f"  consumer group {r['acknowledged']['group']} not moved: {warning}")


def _rechecked(rechecks: list[dict]) -> str:
    """`  rechecked 2x, same counts`, or the latest counts that differ from the first pass."""
    if not rechecks:
        return ""
    changed = [r["counts"] for r in rechecks if r["counts"] is not None]
    if not changed:
        return f"  rechecked {len(rechecks)}x, same counts"
    c = changed[-1]
    return (
        f"  rechecked {len(rechecks)}x; latest: ins {c['inserted']} dupX "
        f"{c['duplicates_in_silver']} quar {c['quarantined']} (later slices took rows, or a reprocess)"
    )


def parser() -> argparse.ArgumentParser:
    """`slicewise`'s command line."""
    parser = argparse.ArgumentParser(
        prog="slicewise", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an expected failure too"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="freeze the slice of an interval [start, end)")
    plan.add_argument("--start", type=instant, required=True)
    plan.add_argument("--end", type=instant, required=True)
    plan.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="after a DATA LOSS report: freeze the slice from what Kafka still retains (logged)",
    )
    plan.add_argument(
        "--accept-topic-reset",
        action="store_true",
        help="after a TOPIC RESET report: read the topic as it is now from its start "
        "(recorded in the ledger)",
    )
    add_pipeline_arg(plan)
    status = sub.add_parser("status", help="slices, offsets, steps and counts from the ledger")
    status.add_argument("--json", action="store_true")
    shown = status.add_mutually_exclusive_group()
    shown.add_argument(
        "--last", type=int, default=24, metavar="N", help="the N latest slices (default 24)"
    )
    shown.add_argument("--since", type=instant, help="the slices starting at or after this time")
    shown.add_argument("--slice-id", help="one slice")
    add_pipeline_arg(status)
    docs = sub.add_parser(
        "docs", help="fetch a slice's Data Docs from the lakehouse into a local folder"
    )
    docs.add_argument("--slice-id", required=True)
    docs.add_argument("--into", default=None, help="default: <state>/fetched_data_docs/<pipeline>")
    add_pipeline_arg(docs)
    pipelines = sub.add_parser(
        "pipelines", help="check the pipeline definition file and list its pipelines"
    )
    pipelines.add_argument("--file", default=None, help="default: SLICEWISE_PIPELINES_FILE")
    sub.add_parser(
        "class-archive",
        help="record the classes of a Spark driver once (about a minute), so that steps run "
        "by hand in a driver of their own start faster (docs/RUNBOOK.md)",
    )
    server = sub.add_parser(
        "spark-server",
        help="print the spark-submit line of a Spark Connect server the pipeline can use "
        "(Spark's own server, our jars as --packages)",
    )
    server.add_argument("--port", type=int, default=15002)
    server.add_argument(
        "--packages", action="store_true", help="print only the Maven coordinates, comma-separated"
    )
    for step in STEPS:
        what = (
            "compact, purge and vacuum the pipeline's tables (docs/OPERATIONS.md)"
            if step in PIPELINE_STEPS
            else f"run the {step} step for one slice"
        )
        p = step_parser(step, sub.add_parser(step, help=what))
        p.add_argument(
            "--master",
            default=None,
            help="run in-process on this Spark master (default: a client of the "
            "SLICEWISE_SPARK_REMOTE server when set, else of the local server when it "
            "runs, else local[*])",
        )
    return parser


def step_engine(settings: Settings, master: str | None) -> tuple[Settings, str]:
    """Where a step run by hand does its Spark work, and the words that say so.

    A client of a running Spark Connect server starts in about a second, on an engine
    whose code paths are already compiled; a driver of its own pays the JVM's start and
    the first run of every path (tens of seconds on a small slice). So the step uses
    the configured server, else the local one if it runs, and says which."""
    from slicewise.connect_auth import redacted
    from slicewise.connect_server import embedded

    if master:
        return settings, f"in its own driver on {master} (--master)"
    if settings.spark_remote:
        return settings, (
            f"on the Spark Connect server {redacted(settings.spark_remote)} "
            "(SLICEWISE_SPARK_REMOTE)"
        )
    server = embedded(settings)
    if server.running():
        local = replace(settings, spark_remote=server.url, spark_token=server.token)
        return local, f"on the local Spark Connect server {server.url} (under {server.home})"
    return settings, (
        "in its own driver on local[*]: no Spark Connect server is configured "
        "(SLICEWISE_SPARK_REMOTE) or running here, so Spark starts first (tens of seconds); "
        "`python -m slicewise.connect_server start` (`make spark-connect-start`) makes "
        "the next steps start in seconds"
    )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = parser().parse_args(argv)

    try:
        if args.command == "pipelines":
            return check_pipelines(args.file)
        if args.command == "spark-server":
            from slicewise.connect_server import documented_command
            from slicewise.spark import spark_packages

            print(",".join(spark_packages()) if args.packages else documented_command(args.port))
            return 0
        if args.command == "class-archive":
            from slicewise.spark import write_class_archive

            path, seconds = write_class_archive()
            print(f"class archive {path} written in {seconds:.0f} s")
            return 0
        settings = load_settings(pipeline=args.pipeline)
        if args.command == "plan":
            from slicewise.planner import plan_slice

            sl = plan_slice(
                settings,
                args.start,
                args.end,
                accept_data_loss=args.accept_data_loss,
                accept_topic_reset=args.accept_topic_reset,
            )
            print(sl.describe())
        elif args.command == "status":
            ledger = Ledger.of(settings)
            shown = shown_slices(ledger, args.last, args.since, args.slice_id)
            rows, holds = status_rows(ledger, shown), list(ledger.holds().values())
            fresh = status_freshness(settings, ledger, rows)
            gaps = unowned_ranges(ledger)
            if args.json:
                held = [{**asdict(h), "since": h.since.isoformat()} for h in holds]
                unowned = [[g.start.isoformat(), g.end.isoformat()] for g in gaps]
                print(
                    json.dumps(
                        {
                            "slices": rows,
                            "unowned": unowned,
                            "held_partitions": held,
                            "freshness": fresh.to_json(),
                        },
                        indent=2,
                    )
                )
            else:
                now = datetime.now(timezone.utc)
                for gap in gaps:
                    print(
                        f"UNOWNED {gap.describe()}: no slice owns these offsets; nothing "
                        "publishes past them and the consumer group stays below them. Run "
                        "those intervals (docs/RUNBOOK.md#unowned-range)."
                    )
                print_holds(holds, now)
                print("\n".join(fresh.describe(now)))
                print_status(rows)
        elif args.command == "docs":
            into = args.into or settings.state_dir / "fetched_data_docs" / settings.pipeline.name
            for page in fetch_docs(settings, args.slice_id, Path(into)):
                print(page.resolve().as_uri())
        else:
            from slicewise.jobs import run

            settings, where = step_engine(settings, args.master)
            print(f"{args.command}: Spark work {where}", file=sys.stderr, flush=True)
            run(args.command, args, master=args.master, settings=settings)
    except ConfigError as exc:
        if args.debug:
            raise
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except OperationalError as exc:
        # Expected (data loss, a held LSO, a failed gate...): the message says the safe
        # action, and a traceback would only bury it. `--debug` shows it.
        if args.debug:
            raise
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def fetch_docs(settings: Settings, slice_id: str, into: Path) -> list[Path]:
    """The Data Docs pages of a slice's latest gate run, copied under `into`."""
    from slicewise.data_docs import fetch

    gate = Ledger.of(settings).step(slice_id, "gate")
    if gate is None:
        raise OperationalError(
            f"slice {slice_id} has no gate outcome in the ledger: run its `gate` task first"
        )
    return fetch(settings, gate.get("data_docs", []), into)


def check_pipelines(path: str | None) -> int:
    """Validate every definition (Great Expectations names included) and list them."""
    from slicewise.pipelines import definitions_file, load_pipelines

    where = path or definitions_file()
    pipelines = load_pipelines(where)
    ledgers = os.environ.get("SLICEWISE_LEDGER_DIR", "").strip().rstrip("/") or "<lakehouse>"
    from slicewise.gate import declared_expectations  # Great Expectations: a slow import

    for p in pipelines.values():
        declared_expectations(p)
        print(
            f"{p.name}: DAG {p.dag_id}, topic {p.topic}, key ({', '.join(p.key)}), "
            f"event time {p.event_time}, {len(p.fields)} fields, horizon {p.horizon_days} d, "
            f"tables <lakehouse>/{p.tables_folder}/, ledger "
            + (
                f"{ledgers}/{p.tables_folder}/_ledger/{p.topic}/"
                if ledgers == "<lakehouse>"
                else f"{ledgers}/{p.tables_folder}/{p.topic}/"
            )
            + f", {len(p.expectations)} extra expectation(s)"
        )
    print(f"{where}: {len(pipelines)} pipeline(s), all valid")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
