"""Fault injection for the failure tests and the chaos suite; inert unless asked for.

`SLICEWISE_FAULTS=bronze.committed,silver.merged` makes each named point raise
`InjectedFault` the first time it is reached for a slice, at the most awkward
moment: after a write has committed but before the step finished and recorded
it. A marker under `<state>/faults/` remembers that the fault fired, so the
retry runs clean, which is exactly what a crash followed by an Airflow retry
looks like. Nothing sets the variable in production.

Points: plan.resolved, bronze.committed, silver.quarantined, silver.merging,
silver.merged, gate.validated, publish.gold_written, announce.recorded. The `ingest`
step passes bronze's point and then silver's three; `silver.merging` just before
silver's MERGE.

`SLICEWISE_FAULT_ACTION=kill` (the chaos suite) sends SIGKILL to the whole process
group instead: a `spark-submit` started in its own session dies like a driver under
`kill -9`, with no `finally`, no shutdown hook and no exit code of its own. `SLICEWISE_FAULT_ACTION=wait` pauses there instead, until
the test that set it creates the marker's `.resume` file beside it (a racing writer's
moment: the chaos suite commits a copy of the slice's key just before the MERGE).
"""

from __future__ import annotations

import os
import signal
import time

from slicewise.config import ConfigError, Settings

POINTS = (
    "plan.resolved",
    "bronze.committed",
    "silver.quarantined",
    "silver.merging",
    "silver.merged",
    "gate.validated",
    "publish.gold_written",
    "announce.recorded",
)


class InjectedFault(RuntimeError):
    """Raised on purpose by a test; a retry of the same step must end exactly right."""


def fault_point(point: str, settings: Settings, slice_id: str) -> None:
    """Fail once per slice at `point` when SLICEWISE_FAULTS names it."""
    wanted = {p.strip() for p in os.environ.get("SLICEWISE_FAULTS", "").split(",") if p.strip()}
    if unknown := wanted.difference(POINTS):
        raise ConfigError(f"SLICEWISE_FAULTS names unknown points {sorted(unknown)}; use {POINTS}.")
    action = os.environ.get("SLICEWISE_FAULT_ACTION", "raise")
    if action not in ("raise", "kill", "wait"):
        raise ConfigError(f"SLICEWISE_FAULT_ACTION={action!r}; use 'raise', 'kill' or 'wait'.")
    if point not in wanted:
        return
    marker = settings.state_dir / "faults" / f"{point}-{slice_id}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    if action == "wait":
        resume = marker.with_name(marker.name + ".resume")
        while not resume.exists():
            time.sleep(0.1)
        return
    if action == "kill":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    raise InjectedFault(f"injected fault at {point} for slice {slice_id} (SLICEWISE_FAULTS)")
