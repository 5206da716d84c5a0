"""The offset ledger: boundaries and slices, stored with the lakehouse.

Plain JSON objects under `<lakehouse>/<pipeline>/_ledger/<topic>/` (or
SLICEWISE_LEDGER_DIR), on local or mounted disk or on the object store the tables
use, readable by Airflow workers (which plan) and Spark drivers (which read slices)
alike. A boundary is written with a create that fails if the name exists (a hard
link on disk, a conditional put on an object store): two resolvers racing on one
boundary both end up with the first one's answer, and a stored boundary is never
rewritten.

Nothing a step does reads the whole ledger: a year of hourly slices is 8,760 of
each object, and every read is a GET on an object store. Boundaries and slices are
named by time, so the next boundary after a time is the first name a listing from
that name returns (one request); `newest-first/` holds an empty marker per boundary
and per slice whose name sorts the other way (each digit d as 9 - d), so the
nearest boundary before a time and the latest slices are one listing too. A marker
is created before its object: every stored object has one; a marker whose object
is missing (its writer died in between) is skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from slicewise.errors import OperationalError
from slicewise.holds import Hold
from slicewise.slices import Boundary, Slice, from_stamp, stamp
from slicewise.store import open_store

STEPS = ("plan", "bronze", "silver", "gate", "publish")
# Recorded by maintenance when bronze retention deleted a published slice's rows.
BRONZE_DROPPED = "bronze_dropped"
INDEX = "newest-first"
PAGE = 20  # keys listed per request when walking to a neighbour
_REVERSED = str.maketrans("0123456789", "9876543210")


def newest_first(name: str) -> str:
    """`name` with each digit d as 9 - d: among names of one fixed-width shape (stamps,
    slice ids) the order flips, so a listing from a name walks back in time."""
    return name.translate(_REVERSED)


def _time_named(key: str, decode: Callable[[str], str] = str, suffix: str = "") -> datetime | None:
    """The time a ledger key's name holds, or None for a name that is not the ledger's:
    an S3-compatible server may list an object still being written under a longer name
    (s3proxy's filesystem backend lists `<key>-<uuid>` until its rename)."""
    name = key.rsplit("/", 1)[1]
    if not name.endswith(suffix):
        return None
    try:
        return from_stamp(decode(name[: len(name) - len(suffix)]))
    except ValueError:
        return None


def _dump(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, indent=2, sort_keys=True, default=str).encode()


def _boundary_to_json(b: Boundary) -> dict[str, Any]:
    return {
        "topic": b.topic,
        "at": b.at.isoformat(),
        "offsets": {str(p): o for p, o in sorted(b.offsets.items())},
        "resolved_at": (b.resolved_at or datetime.now(UTC)).isoformat(),
    }


def _boundary_from_json(d: dict[str, Any]) -> Boundary:
    return Boundary(
        topic=d["topic"],
        at=datetime.fromisoformat(d["at"]),
        offsets={int(p): int(o) for p, o in d["offsets"].items()},
        resolved_at=datetime.fromisoformat(d["resolved_at"]),
    )


def slice_to_json(sl: Slice) -> dict[str, Any]:
    return {
        "slice_id": sl.slice_id,
        "topic": sl.topic,
        "start": sl.start.isoformat(),
        "end": sl.end.isoformat(),
        "ranges": {str(p): [a, b] for p, (a, b) in sorted(sl.ranges.items())},
    }


def slice_from_json(d: dict[str, Any]) -> Slice:
    return Slice(
        topic=d["topic"],
        start=datetime.fromisoformat(d["start"]),
        end=datetime.fromisoformat(d["end"]),
        ranges={int(p): (int(a), int(b)) for p, (a, b) in d["ranges"].items()},
    )


class SliceNotPlanned(OperationalError, LookupError):
    """A step was asked for a slice the ledger does not hold: plan its interval first."""


class Ledger:
    def __init__(self, location: str, topic: str):
        self.topic = topic
        self.store = open_store(location.rstrip("/") + "/" + topic)

    def _read(self, key: str) -> Any:
        data = self.store.read(key)
        return None if data is None else json.loads(data)

    # -- boundaries -------------------------------------------------------
    @staticmethod
    def _boundary_key(at: datetime) -> str:
        return f"boundaries/{stamp(at)}.json"

    @staticmethod
    def _marker(kind: str, name: str) -> str:
        return f"{INDEX}/{kind}/{newest_first(name)}"

    def boundary(self, at: datetime) -> Boundary | None:
        found = self._read(self._boundary_key(at))
        return None if found is None else _boundary_from_json(found)

    def boundaries(self) -> list[Boundary]:
        """Every stored boundary, oldest first (reads the whole history: tests and tools)."""
        keys = [k for k in self.store.keys("boundaries") if _time_named(k, suffix=".json")]
        return [_boundary_from_json(json.loads(self.store.read(k) or b"")) for k in sorted(keys)]

    def put_boundary(self, b: Boundary) -> Boundary:
        """Store `b` unless a boundary for that time exists; return the stored one."""
        self._indexed()
        self.store.create(self._marker("boundaries", stamp(b.at)), b"")
        self.store.create(self._boundary_key(b.at), _dump(_boundary_to_json(b)))
        stored = self.boundary(b.at)
        assert stored is not None
        return stored

    def before(self, at: datetime) -> Boundary | None:
        """The nearest stored boundary before `at`: one listing of the markers, whatever
        the history holds (more only past markers whose boundary was never written)."""
        self._indexed()
        return self._first_stored(
            f"{INDEX}/boundaries", self._marker("boundaries", stamp(at)), newest_first
        )

    def after(self, at: datetime) -> Boundary | None:
        """The nearest stored boundary after `at`: one listing from its name."""
        return self._first_stored("boundaries", self._boundary_key(at), suffix=".json")

    def _first_stored(
        self, prefix: str, after: str, decode: Callable[[str], str] = str, suffix: str = ""
    ) -> Boundary | None:
        """The first boundary a listing of `prefix` from `after` names that is stored."""
        while keys := self.store.keys(prefix, after=after, limit=PAGE):
            for key in keys:
                named = _time_named(key, decode, suffix)
                found = None if named is None else self.boundary(named)
                if found is not None:
                    return found
            after = keys[-1]
        return None

    def neighbours(self, at: datetime) -> tuple[Boundary | None, Boundary | None]:
        """The nearest stored boundaries before and after `at`."""
        return self.before(at), self.after(at)

    def newest_boundary(self) -> Boundary | None:
        return self.before(datetime.max.replace(tzinfo=UTC))

    def _indexed(self) -> None:
        """Give a ledger written before the markers existed its markers, once."""
        if getattr(self, "_has_index", False):
            return
        if self.store.read(f"{INDEX}/complete") is None:
            for key in self.store.keys("boundaries"):
                if (named := _time_named(key, suffix=".json")) is not None:
                    self.store.create(self._marker("boundaries", stamp(named)), b"")
            for sl in self.slices():
                self.store.create(self._marker("slices", sl.slice_id), b"")
            self.store.create(f"{INDEX}/complete", b"")
        self._has_index = True

    # -- partitions an open transaction holds back ---------------------------
    def holds(self) -> dict[int, Hold]:
        found = self._read("holds.json") or {}
        return {
            int(p): Hold(int(p), h["offset"], h["waiting"], datetime.fromisoformat(h["since"]))
            for p, h in found.items()
        }

    def save_holds(self, holds: dict[int, Hold]) -> None:
        """The latest plan's view (planners racing may each write theirs: both are current)."""
        payload = {
            str(h.partition): {
                "offset": h.offset,
                "waiting": h.waiting,
                "since": h.since.isoformat(),
            }
            for h in holds.values()
        }
        self.store.replace("holds.json", _dump(payload))

    # -- slices and their steps --------------------------------------------
    def save_slice(self, sl: Slice) -> None:
        self._indexed()
        self.store.create(self._marker("slices", sl.slice_id), b"")
        created = self.store.create(f"slices/{sl.slice_id}/slice.json", _dump(slice_to_json(sl)))
        if not created and self.load_slice(sl.slice_id) != sl:
            raise RuntimeError(
                f"ledger already holds a different {sl.slice_id}; boundaries changed?"
            )

    def load_slice(self, slice_id: str) -> Slice:
        found = self._read(f"slices/{slice_id}/slice.json")
        if found is None:
            raise SliceNotPlanned(
                f"slice {slice_id} is not in the ledger at {self.store}; run the plan step for "
                "its interval first (`slicewise plan --start ... --end ...`)."
            )
        return slice_from_json(found)

    def latest_slices(self, last: int, since: datetime | None = None) -> list[Slice]:
        """The `last` slices with the latest starts (and only those starting at or after
        `since`), oldest first: a listing of markers and a read per slice shown."""
        self._indexed()
        found: list[Slice] = []
        after = None
        while len(found) < last:
            keys = self.store.keys(
                f"{INDEX}/slices", after=after, limit=min(PAGE, last - len(found))
            )
            if not keys:
                break
            for key in keys:
                data = self._read(f"slices/{newest_first(key.rsplit('/', 1)[1])}/slice.json")
                if data is None:
                    continue  # its planner died between the marker and the slice
                sl = slice_from_json(data)
                if since is not None and sl.start < since:
                    return found[::-1]
                found.append(sl)
            after = keys[-1]
        return found[::-1]

    def slices(self) -> list[Slice]:
        """Every slice, oldest first (reads the whole history: tests and tools)."""
        keys = [k for k in self.store.keys("slices") if k.endswith("/slice.json")]
        return [slice_from_json(json.loads(self.store.read(k) or b"")) for k in sorted(keys)]

    def record_step(self, slice_id: str, step: str, info: dict[str, Any]) -> None:
        """Latest outcome of a step, for `slicewise status`; Delta stays the source of truth."""
        payload = {"step": step, "recorded_at": datetime.now(UTC).isoformat(), **info}
        self.store.replace(f"slices/{slice_id}/{step}.json", _dump(payload))

    def step(self, slice_id: str, step: str) -> dict[str, Any] | None:
        return self._read(f"slices/{slice_id}/{step}.json")
