"""The silver Asset of each pipeline: defined once for the DAG that announces it and
those that consume it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Asset


def silver_asset(pipeline: str) -> Asset:
    """`slicewise_<pipeline>_silver`: one event per published slice of that pipeline."""
    return Asset(name=f"slicewise_{pipeline}_silver", uri=f"slicewise://{pipeline}/silver")


def announce(
    pipeline: str,
    slice_id: str,
    data_interval_end: datetime,
    inlet_events: Any,
    outlet_events: Any,
) -> None:
    """Emit the silver Asset event once per slice that read anything (and once more per
    replay of it); a re-run is skipped.

    An empty slice (no committed record in its interval) changes nothing downstream,
    so it is not announced. The event's extra carries the slice's counts.

    "Already announced" is asked of Airflow's own Asset events, not of our
    ledger: a worker dying after writing the ledger but before Airflow stored
    the event must lead to an announcement on retry, not to none at all.
    """
    from airflow.sdk.exceptions import AirflowSkipException

    from slicewise.config import load_settings
    from slicewise.faults import fault_point
    from slicewise.ledger import Ledger

    settings = load_settings(pipeline=pipeline)
    silver = silver_asset(pipeline)
    ledger = Ledger.of(settings)
    # A replay changes what the slice published: it is announced again, as a revision.
    revision = (ledger.step(slice_id, "replay") or {}).get("recorded_at")
    this = (settings.topic, slice_id, revision)
    # Events for a slice are only emitted after its interval has closed.
    for event in inlet_events[silver].after(data_interval_end):
        extra = event.extra or {}
        if (extra.get("topic"), extra.get("slice_id"), extra.get("revision")) == this:
            raise AirflowSkipException(
                f"slice {slice_id} of {settings.topic} was already announced "
                f"({event.timestamp}); nothing changes downstream"
            )
    counts = (ledger.step(slice_id, "gate") or {}).get("counts") or {}
    if counts.get("read") == 0:
        ledger.record_step(slice_id, "announce", {"skipped": "empty slice"})
        raise AirflowSkipException(
            f"slice {slice_id} of {settings.topic} is empty (no committed record in its "
            "interval): nothing to announce"
        )
    publication = ledger.step(slice_id, "publish") or {}
    extra = {
        "pipeline": pipeline,
        "topic": settings.topic,
        "slice_id": slice_id,
        "revision": revision,
        "silver_version": publication.get("silver_version"),
        "gold_version": publication.get("gold_version"),
        "hours": publication.get("hours"),
        "counts": {k: counts.get(k) for k in ("read", "quarantined", "inserted")},
    }
    outlet_events[silver].extra = extra
    ledger.record_step(slice_id, "announce", extra)
    fault_point("announce.recorded", settings, slice_id)
