"""The offset ledger: boundaries and slices, stored with the lakehouse.

Plain JSON files under `<lakehouse>/_ledger/<topic>/` (or SLICEWISE_LEDGER_DIR),
readable by Airflow workers (which plan) and Spark drivers (which read slices) alike. A boundary
file is published with a hard link, which fails if the name exists: two
resolvers racing on one boundary both end up with the first one's answer, and a
stored boundary is never rewritten.

Object stores need a conditional put for the same guarantee; until a store for
them exists the ledger refuses non-local locations: with the tables on s3a:// or
abfss://, put the ledger on a shared mount (docs/DEPLOYING.md).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slicewise.config import ConfigError
from slicewise.holds import Hold
from slicewise.slices import Boundary, Slice, stamp

STEPS = ("plan", "bronze", "silver", "gate", "publish")


def _local_path(location: str) -> Path:
    if location.startswith("file:"):
        location = location[len("file:") :]
        location = "/" + location.lstrip("/")
    if "://" in location:
        raise ConfigError(
            f"the offset ledger needs a local or mounted (NFS, EFS) path, not {location}: "
            "set SLICEWISE_LEDGER_DIR to one that every Airflow worker and Spark driver "
            "mounts (the Delta tables may stay on the object store)."
        )
    return Path(location)


def _write_new(path: Path, payload: dict[str, Any]) -> bool:
    """Create `path` atomically; False (and no change) if it already exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(payload, tmp, indent=2, sort_keys=True)
        tmp.flush()
        os.fsync(tmp.fileno())
    try:
        os.link(tmp.name, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp.name)


def _replace(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(payload, tmp, indent=2, sort_keys=True, default=str)
    os.replace(tmp.name, path)


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
        self.root = _local_path(location) / topic

    # -- boundaries -------------------------------------------------------
    def _boundary_path(self, at: datetime) -> Path:
        return self.root / "boundaries" / f"{stamp(at)}.json"

    def boundary(self, at: datetime) -> Boundary | None:
        path = self._boundary_path(at)
        return _boundary_from_json(json.loads(path.read_text())) if path.exists() else None

    def boundaries(self) -> list[Boundary]:
        folder = self.root / "boundaries"
        files = sorted(folder.glob("*.json")) if folder.exists() else []
        return [_boundary_from_json(json.loads(f.read_text())) for f in files]

    def put_boundary(self, b: Boundary) -> Boundary:
        """Store `b` unless a boundary for that time exists; return the stored one."""
        _write_new(self._boundary_path(b.at), _boundary_to_json(b))
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
        path = self.root / "holds.json"
        if not path.exists():
            return {}
        return {
            int(p): Hold(int(p), h["offset"], h["waiting"], datetime.fromisoformat(h["since"]))
            for p, h in json.loads(path.read_text()).items()
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
        _replace(self.root / "holds.json", payload)

    # -- slices and their steps --------------------------------------------
    def _slice_dir(self, slice_id: str) -> Path:
        return self.root / "slices" / slice_id

    def save_slice(self, sl: Slice) -> None:
        path = self._slice_dir(sl.slice_id) / "slice.json"
        if not _write_new(path, slice_to_json(sl)) and self.load_slice(sl.slice_id) != sl:
            raise RuntimeError(
                f"ledger already holds a different {sl.slice_id}; boundaries changed?"
            )

    def load_slice(self, slice_id: str) -> Slice:
        path = self._slice_dir(slice_id) / "slice.json"
        if not path.exists():
            raise LookupError(
                f"slice {slice_id} is not in the ledger at {self.root}; run the plan step for its "
                "interval first (`slicewise plan --start ... --end ...`)."
            )
        return slice_from_json(json.loads(path.read_text()))

    def slices(self) -> list[Slice]:
        folder = self.root / "slices"
        files = sorted(folder.glob("*/slice.json")) if folder.exists() else []
        return [slice_from_json(json.loads(f.read_text())) for f in files]

    def record_step(self, slice_id: str, step: str, info: dict[str, Any]) -> None:
        """Latest outcome of a step, for `slicewise status`; Delta stays the source of truth."""
        _replace(
            self._slice_dir(slice_id) / f"{step}.json",
            {"step": step, "recorded_at": datetime.now(UTC).isoformat(), **info},
        )

    def step(self, slice_id: str, step: str) -> dict[str, Any] | None:
        path = self._slice_dir(slice_id) / f"{step}.json"
        return json.loads(path.read_text()) if path.exists() else None
