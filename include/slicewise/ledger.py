"""The offset ledger: boundaries and slices, stored with the lakehouse.

Plain JSON objects under `<lakehouse>/<pipeline>/_ledger/<topic>/` (or
`SLICEWISE_LEDGER_DIR/<pipeline>/<topic>/`: `Settings.ledger_dir`), on local or mounted disk or on the object store the
tables use, readable by Airflow workers (which plan) and Spark drivers (which read
slices) alike. A boundary is written with a create that fails if the name exists (a
hard link on disk, a conditional put on an object store): two resolvers racing on one
boundary both end up with the first one's answer, and a stored boundary is never
rewritten.

Nothing a step does reads the whole ledger: a year of hourly slices is 8,760 of
each object, and every read is a GET on an object store. Boundaries are named by
time in a folder per UTC day (`boundaries/<day>/<stamp>.json`), so the next boundary
after a time is the first name a listing of its day from that name returns, or of
the next day that has one (one listing names the days). `newest-first/` holds an
empty marker per boundary and per slice, in day folders too, whose names sort the
other way (each digit d as 9 - d), so the nearest boundary before a time and the
latest slices are found the same way backwards. Day folders keep each listing to
one day's names: S3 serves `start-after` from its index, but a server on a
filesystem (s3proxy, MinIO) walks the whole folder it lists. A marker is created
before its object: every stored object has one; a marker whose object is missing
(its writer died in between) is skipped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from slicewise.errors import ConfigError, OperationalError
from slicewise.holds import Hold
from slicewise.lease import PlanningLease, planning_lease
from slicewise.slices import Boundary, Slice, from_stamp, stamp
from slicewise.store import open_store

if TYPE_CHECKING:
    from slicewise.config import Settings

STEPS = ("plan", "bronze", "silver", "gate", "publish")
# Recorded by maintenance when bronze retention deleted a published slice's rows.
BRONZE_DROPPED = "bronze_dropped"
INDEX = "newest-first"
# Written once every object an earlier version stored flat has its place in a day folder.
BY_DAY = "layout/by-day"
PAGE = 20  # keys listed per request when walking to a neighbour
log = logging.getLogger(__name__)
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
        "resolved_at": (b.resolved_at or datetime.now(timezone.utc)).isoformat(),
        "topic_id": b.topic_id,
        "epoch": b.epoch,
        "below": {str(p): list(r) for p, r in sorted(b.below.items())},
    }


def _boundary_from_json(d: dict[str, Any]) -> Boundary:
    return Boundary(
        topic=d["topic"],
        at=datetime.fromisoformat(d["at"]),
        offsets={int(p): int(o) for p, o in d["offsets"].items()},
        resolved_at=datetime.fromisoformat(d["resolved_at"]),
        topic_id=d.get("topic_id"),
        epoch=int(d.get("epoch", 0)),
        below={int(p): (int(r[0]), int(r[1])) for p, r in d.get("below", {}).items()},
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


@lru_cache(maxsize=32)
def earlier_location(root: str, own: str, topic: str, name: str, sharing: tuple[str, ...]) -> str:
    """`own`, unless the ledger is still where earlier versions kept it, one per topic
    under SLICEWISE_LEDGER_DIR (`<root>/<topic>/`) and `own` holds none: that ledger is
    used where it is while this pipeline is the only one reading the topic. Shared by
    several, it holds their records mixed, and every step refuses until it is moved."""

    def holds_a_ledger(location: str) -> bool:
        return bool(open_store(f"{location}/{topic}").keys("boundaries", limit=1))

    if not holds_a_ledger(root) or holds_a_ledger(own):
        return own
    if not sharing:
        return root
    pipelines = ", ".join(sorted((name, *sharing)))
    raise ConfigError(
        f"the offset ledger at {root}/{topic} is shared by pipelines {pipelines} of topic "
        f"{topic!r} (an earlier version kept one ledger per topic under "
        "SLICEWISE_LEDGER_DIR): one pipeline's passing gate could publish rows another's "
        f"gate rejected. Give each its own: copy {root}/{topic}/ to <SLICEWISE_LEDGER_DIR>/"
        f"<pipeline's tables folder>/{topic}/ for each of them, then run each pipeline's gate "
        "again for its slices not yet published (docs/RUNBOOK.md#a-shared-ledger)."
    )


class SliceNotPlanned(OperationalError, LookupError):
    """A step was asked for a slice the ledger does not hold: plan its interval first."""


class Ledger:
    def __init__(self, location: str, topic: str):
        self.topic = topic
        self.store = open_store(location.rstrip("/") + "/" + topic)

    @classmethod
    def of(cls, settings: Settings) -> Ledger:
        """The pipeline's ledger (`Settings.ledger_dir`, or where an earlier version kept
        it: `earlier_location`)."""
        pipeline = settings.pipeline
        if settings.ledger_location is None:
            return cls(settings.ledger_dir, settings.topic)
        where = earlier_location(
            settings.ledger_location.rstrip("/"),
            settings.ledger_dir,
            settings.topic,
            pipeline.name,
            settings.topic_shared_with,
        )
        return cls(where, settings.topic)

    def _read(self, key: str) -> Any:
        data = self.store.read(key)
        return None if data is None else json.loads(data)

    # -- boundaries -------------------------------------------------------
    @staticmethod
    def _boundary_key(at: datetime) -> str:
        name = stamp(at)
        return f"boundaries/{name[:8]}/{name}.json"

    @staticmethod
    def _marker(kind: str, name: str) -> str:
        """A boundary's (`name` its stamp) or a slice's (its id) marker; both names start
        with their UTC day, so reversed they start with the day's folder."""
        reversed_name = newest_first(name)
        return f"{INDEX}/{kind}/{reversed_name[:8]}/{reversed_name}"

    def boundary(self, at: datetime) -> Boundary | None:
        self._by_day()
        found = self._read(self._boundary_key(at))
        return None if found is None else _boundary_from_json(found)

    def boundaries(self) -> list[Boundary]:
        """Every stored boundary, oldest first (reads the whole history: tests and tools)."""
        self._by_day()
        keys = [
            k
            for k in self.store.keys("boundaries")
            if k.count("/") == 2 and _time_named(k, suffix=".json")
        ]
        return [_boundary_from_json(json.loads(self.store.read(k) or b"")) for k in sorted(keys)]

    def put_boundary(self, b: Boundary, lease: PlanningLease | None = None) -> Boundary:
        """Store `b` unless a boundary for that time exists; return the stored one. A new
        boundary is stored under the planning `lease` (`PlanningLease.intend`)."""
        self._by_day()
        if lease is not None:
            lease.intend(_dump(_boundary_to_json(b)))
        self.store.create(self._marker("boundaries", stamp(b.at)), b"")
        self.store.create(self._boundary_key(b.at), _dump(_boundary_to_json(b)))
        stored = self.boundary(b.at)
        assert stored is not None
        return stored

    def before(self, at: datetime) -> Boundary | None:
        """The nearest stored boundary before `at`: a listing of the markers of its day
        from its name, whatever the history holds (more only when that day has none
        before it, or past markers whose boundary was never written)."""
        self._by_day()
        markers = self._listed(f"{INDEX}/boundaries", self._marker("boundaries", stamp(at)))
        return self._first_stored(markers, newest_first)

    def after(self, at: datetime) -> Boundary | None:
        """The nearest stored boundary after `at`: a listing of its day from its name."""
        self._by_day()
        return self._first_stored(
            self._listed("boundaries", self._boundary_key(at)), suffix=".json"
        )

    def _first_stored(
        self, keys: Iterator[str], decode: Callable[[str], str] = str, suffix: str = ""
    ) -> Boundary | None:
        """The first boundary `keys` name that is stored."""
        for key in keys:
            named = _time_named(key, decode, suffix)
            found = None if named is None else self.boundary(named)
            if found is not None:
                return found
        return None

    def _listed(self, root: str, start: str | None = None) -> Iterator[str]:
        """The keys in `root`'s day folders in name order, from just after `start` (a key
        in one of them; from the first day when None): that day's keys a page at a time,
        then, only if asked for more, each later day's (one listing names the days)."""
        day = None if start is None else start.rsplit("/", 1)[0]
        if day is not None:
            yield from self._pages(day, start)
        for folder in self.store.folders(root):
            if day is None or folder > day:
                yield from self._pages(folder)

    def _pages(self, folder: str, after: str | None = None) -> Iterator[str]:
        while keys := self.store.keys(folder, after=after, limit=PAGE):
            yield from keys
            after = keys[-1]

    def neighbours(self, at: datetime) -> tuple[Boundary | None, Boundary | None]:
        """The nearest stored boundaries before and after `at`."""
        return self.before(at), self.after(at)

    def newest_boundary(self) -> Boundary | None:
        return self.before(datetime.max.replace(tzinfo=timezone.utc))

    def _by_day(self) -> None:
        """Give a ledger an earlier version wrote flat (boundaries, and markers if any, in
        one folder each) its day folders, once: copies, marker first, created as any
        boundary is. The flat objects stay and are no longer read."""
        if getattr(self, "_laid_out", False):
            return
        if self.store.read(BY_DAY) is None:
            for key in self.store.keys("boundaries"):
                named = _time_named(key, suffix=".json")
                if key.count("/") == 1 and named is not None:
                    self.store.create(self._marker("boundaries", stamp(named)), b"")
                    self.store.create(self._boundary_key(named), self.store.read(key) or b"")
            for key in self.store.keys("slices"):
                if key.endswith("/slice.json"):
                    self.store.create(self._marker("slices", key.split("/")[1]), b"")
            self.store.create(BY_DAY, b"")
        self._laid_out = True

    # -- one planner resolves new boundaries at a time ------------------------
    def planning(
        self, lease: timedelta = timedelta(seconds=45)
    ) -> AbstractContextManager[PlanningLease]:
        """Hold the ledger's planning lease while new boundaries are resolved and stored
        (`slicewise.lease`: a planner whose lease was taken over stores none)."""
        return planning_lease(self.store, self._put_intended, lease)

    def _put_intended(self, boundary: bytes) -> None:
        self.put_boundary(_boundary_from_json(json.loads(boundary)))

    # -- epochs: one per log the topic's offsets counted in -------------------
    def epochs(self) -> list[dict[str, Any]]:
        """Every accepted topic reset, oldest first (a handful in a pipeline's life)."""
        return [self._read(k) for k in sorted(self.store.keys("epochs")) if k.endswith(".json")]

    def current_epoch(self) -> int:
        found = self.epochs()
        return found[-1]["epoch"] if found else 0

    def start_epoch(self, epoch: int, info: dict[str, Any]) -> dict[str, Any]:
        """Record an accepted reset as `epoch`; the first planner to record it wins."""
        payload = {"epoch": epoch, "accepted_at": datetime.now(timezone.utc).isoformat(), **info}
        self.store.create(f"epochs/{epoch:06d}.json", _dump(payload))
        return self._read(f"epochs/{epoch:06d}.json")

    # -- the newest version of silver a publication read ------------------------
    def verified_floor(self) -> int:
        """A version of silver some publication read (0: none yet): every version at or
        below it was proved, so publication walks silver's commits only above it. A
        ledger from before the floor starts from the newest publications' versions."""
        found = self._read("verified.json")
        if found is not None:
            return int(found["silver_version"])
        published = [self.step(sl.slice_id, "publish") for sl in self.latest_slices(PAGE)]
        return max((int(p["silver_version"]) for p in published if p), default=0)

    def raise_verified_floor(self, version: int) -> None:
        """Publications racing may write an older floor last: it is still one that was
        proved, and the next walk is only longer."""
        if version > self.verified_floor():
            self.store.replace("verified.json", _dump({"silver_version": version}))

    # -- marks: how far a walk over the slices got, only ever raised ------------
    def mark(self, name: str) -> dict[str, Any] | None:
        return self._read(f"marks/{name}.json")

    def create_mark(self, name: str, value: dict[str, Any]) -> None:
        """The mark's first value; a mark already there (a racing walk's) stays."""
        self.store.create(f"marks/{name}.json", _dump(value))

    def raise_mark(self, name: str, field: str, at: datetime, **extra: Any) -> None:
        """Set the mark's `field` to `at` (and `extra`) if that raises it. Walks racing
        may write an older value last: it is still one a walk reached, and the next walk
        is only longer."""
        found = self.mark(name) or {}
        if field in found and datetime.fromisoformat(found[field]) >= at:
            return
        self.store.replace(f"marks/{name}.json", _dump({**found, **extra, field: at.isoformat()}))

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
        self._by_day()
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
        `since`), oldest first: listings of the markers of the latest days and a read per
        slice shown."""
        self._by_day()
        found: list[Slice] = []
        markers = self._listed(f"{INDEX}/slices")
        while len(found) < last and (key := next(markers, None)) is not None:
            data = self._read(f"slices/{newest_first(key.rsplit('/', 1)[1])}/slice.json")
            if data is None:
                continue  # its planner died between the marker and the slice
            sl = slice_from_json(data)
            if since is not None and sl.start < since:
                break
            found.append(sl)
        return found[::-1]

    def slices(self) -> list[Slice]:
        """Every slice, oldest first (reads the whole history: tests and tools)."""
        keys = [k for k in self.store.keys("slices") if k.endswith("/slice.json")]
        return [slice_from_json(json.loads(self.store.read(k) or b"")) for k in sorted(keys)]

    def record_step(self, slice_id: str, step: str, info: dict[str, Any]) -> None:
        """Latest outcome of a step, for `slicewise status`; Delta stays the source of truth."""
        payload = {"step": step, "recorded_at": datetime.now(timezone.utc).isoformat(), **info}
        self.store.replace(f"slices/{slice_id}/{step}.json", _dump(payload))

    def step(self, slice_id: str, step: str) -> dict[str, Any] | None:
        return self._read(f"slices/{slice_id}/{step}.json")
