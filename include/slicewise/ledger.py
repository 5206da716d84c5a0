"""The offset ledger: boundaries and slices, stored with the lakehouse.

Plain JSON objects under `<lakehouse>/_ledger/<topic>/` (or SLICEWISE_LEDGER_DIR),
on local or mounted disk or on the object store the tables use, readable by
Airflow workers (which plan) and Spark drivers (which read slices) alike. A
boundary is written with a create that fails if the name exists (a hard link on
disk, a conditional put on an object store): two resolvers racing on one boundary
both end up with the first one's answer, and a stored boundary is never rewritten.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from slicewise.holds import Hold
from slicewise.slices import Boundary, Slice, stamp
from slicewise.store import open_store

STEPS = ("plan", "bronze", "silver", "gate", "publish")


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

    def boundary(self, at: datetime) -> Boundary | None:
        found = self._read(self._boundary_key(at))
        return None if found is None else _boundary_from_json(found)

    def boundaries(self) -> list[Boundary]:
        keys = [k for k in self.store.keys("boundaries") if k.endswith(".json")]
        return [_boundary_from_json(json.loads(self.store.read(k) or b"")) for k in sorted(keys)]

    def put_boundary(self, b: Boundary) -> Boundary:
        """Store `b` unless a boundary for that time exists; return the stored one."""
        self.store.create(self._boundary_key(b.at), _dump(_boundary_to_json(b)))
        stored = self.boundary(b.at)
        assert stored is not None
        return stored

    def neighbours(self, at: datetime) -> tuple[Boundary | None, Boundary | None]:
        """The nearest stored boundaries before and after `at`."""
        before = after = None
        for b in self.boundaries():
            if b.at < at:
                before = b
            elif b.at > at and after is None:
                after = b
        return before, after

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
        created = self.store.create(f"slices/{sl.slice_id}/slice.json", _dump(slice_to_json(sl)))
        if not created and self.load_slice(sl.slice_id) != sl:
            raise RuntimeError(
                f"ledger already holds a different {sl.slice_id}; boundaries changed?"
            )

    def load_slice(self, slice_id: str) -> Slice:
        found = self._read(f"slices/{slice_id}/slice.json")
        if found is None:
            raise LookupError(
                f"slice {slice_id} is not in the ledger at {self.store}; run the plan step for "
                "its interval first (`slicewise plan --start ... --end ...`)."
            )
        return slice_from_json(found)

    def slices(self) -> list[Slice]:
        keys = [k for k in self.store.keys("slices") if k.endswith("/slice.json")]
        return [slice_from_json(json.loads(self.store.read(k) or b"")) for k in sorted(keys)]

    def record_step(self, slice_id: str, step: str, info: dict[str, Any]) -> None:
        """Latest outcome of a step, for `slicewise status`; Delta stays the source of truth."""
        payload = {"step": step, "recorded_at": datetime.now(UTC).isoformat(), **info}
        self.store.replace(f"slices/{slice_id}/{step}.json", _dump(payload))

    def step(self, slice_id: str, step: str) -> dict[str, Any] | None:
        return self._read(f"slices/{slice_id}/{step}.json")
