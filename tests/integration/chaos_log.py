"""The chaos suite's table, and its record of runs across sessions.

The full suite (20 runs per scenario, ~5 minutes a run on 2 cores) takes longer than
one working session, and every process of a session ends with it. So `make chaos`
appends each run, failed ones included, as one JSON line to `chaos/chaos_runs.jsonl`
(committed with the code the run exercised), and `make chaos-report` sums every
recorded run into the table:

    .venv/bin/python tests/integration/chaos_log.py [chaos/chaos_runs.jsonl]
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

RECORD = Path(__file__).resolve().parents[2] / "chaos" / "chaos_runs.jsonl"

# Scenario keys (for SLICEWISE_CHAOS_SCENARIOS and the record) and what they do.
SCENARIOS = {
    "boundary": "kill -9 at every step boundary",
    "mid-step": "kill -9 mid-step (random)",
    "zombie": "zombie attempt outlives its retry",
    "orphan": "orphaned driver races its retry",
    "broker-restart": "broker restart mid-step",
    "client-killed": "client killed, server finishes the write",
    "server-restart": "Spark Connect server killed and restarted",
    "two-clients": "two clients of one slice at once",
    "maintenance": "maintenance beside each step of a backfill",
    "mixed": "mixed: a random strike per step",
    "failed-gate": "a failed gate holds the next slice's publication",
    "racing-copy": "a copy of a key stored between silver's probe and its MERGE",
    "worker-killed": "Celery worker's host killed mid-ingest, retried on a new worker",
    "retried-merge": "a MERGE killed before its record, retried; the next slice's publication refused",
    "shared-topic": "two pipelines on one topic, one ledger root: the strict one's gate holds",
    "scheduler-away": "one-minute DAG: scheduler killed or DAG paused 3+ intervals, catchup off",
}

# Code whose change makes earlier runs evidence about other code.
EXERCISED = ("include", "spark_jobs", "dags", "tests/integration/test_chaos.py")


@dataclass
class Row:
    scenario: str  # a key of SCENARIOS
    runs: int = 0
    failed: int = 0  # runs that ended in an error before the comparison (e.g. retries ran out)
    struck: int = 0  # attempts killed, frozen as zombies, or cut off by a broker restart
    events: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0  # in silver but never committed (e.g. from an aborted transaction)
    quarantined: int = 0
    quarantine_wrong: int = 0  # malformed offsets missing from quarantine, or extra ones

    def add(self, other: Row) -> None:
        for f in fields(self):
            if f.name != "scenario":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def clean(self) -> bool:
        return not (
            self.failed or self.lost or self.duplicated or self.unexpected or self.quarantine_wrong
        )


def render(rows: list[Row]) -> str:
    lines = [
        "",
        "| scenario | runs | failed | struck | events | lost | duplicated | unexpected "
        "| quarantined |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        wrong = f" ({r.quarantine_wrong} wrong)" if r.quarantine_wrong else ""
        lines.append(
            f"| {SCENARIOS[r.scenario]} | {r.runs} | {r.failed} | {r.struck} | {r.events} | "
            f"{r.lost} | {r.duplicated} | {r.unexpected} | {r.quarantined}{wrong} |"
        )
    return "\n".join(lines)


ROOT = RECORD.parents[1]  # the repo root: EXERCISED is relative to it


def git(*args: str, root: Path = ROOT) -> str:
    """Git's output, empty when it fails (e.g. a commit this clone does not have)."""
    run = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    return run.stdout.strip()


def commit() -> str:
    """HEAD, with `+changes` when the exercised code differs from it."""
    dirty = git("status", "--porcelain", "--", *EXERCISED)
    return git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")


def code_version(recorded: str, root: Path = ROOT) -> str:
    """The last commit at or before the `recorded` one that changed the exercised code, so runs
    recorded at README- or record-only commits count for the code they actually ran."""
    head, plus, changes = recorded.partition("+")
    found = git("log", "-1", "--format=%h", head, "--", *EXERCISED, root=root)
    return (found or head) + plus + changes  # unknown commit: as recorded


def append(
    path: Path, run: Row, seed: int, seconds: float, error: str | None, store: str = "local"
) -> None:
    """One run as one line; appending keeps earlier runs even if this session is cut off."""
    line = {
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "store": store,  # where the lakehouse and the ledger were: local disk, or s3
        "seed": seed,
        "seconds": round(seconds, 1),
        "error": error,
        **asdict(run),
    }
    with path.open("a") as out:
        out.write(json.dumps(line) + "\n")


def summed(path: Path) -> tuple[list[Row], list[dict]]:
    """One row per scenario over every recorded run, and the records themselves."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = {key: Row(key) for key in SCENARIOS}
    names = {f.name for f in fields(Row)}
    for record in records:
        rows[record["scenario"]].add(Row(**{k: v for k, v in record.items() if k in names}))
    return [row for row in rows.values() if row.runs], records


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else RECORD
    if not path.exists():
        print(f"no chaos runs recorded in {path}; `make chaos` records them")
        return 1
    rows, records = summed(path)
    print(render(rows))
    hours = sum(r["seconds"] for r in records) / 3600
    versions = Counter(code_version(r["commit"]) for r in records)
    stores = Counter(r.get("store", "local") for r in records)
    print(
        f"\n{len(records)} runs recorded {records[0]['at']} .. {records[-1]['at']}, "
        f"{hours:.1f} hours; runs per version of the exercised code: "
        + ", ".join(f"{version} {n}" for version, n in versions.items())
        + "; per store: "
        + ", ".join(f"{store} {n}" for store, n in stores.items())
    )
    for r in records:
        if r["error"]:
            print(f"failed: {r['scenario']} seed {r['seed']} at {r['commit']}: {r['error']}")
    return 0 if all(row.clean for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
