"""How far behind the pipeline is: what on-call asks first, as pure functions.

Two numbers answer it. Per partition, how many offsets the newest frozen boundary
is behind the last stable offset (what is readable but not yet in any slice); and
how old the newest published slice's data is. A lag that grows while the age
grows means runs are not happening; a large age with no lag means the topic is
quiet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from slicewise.slices import Boundary


@dataclass(frozen=True)
class Published:
    slice_id: str
    end: datetime  # the interval's end: the slice holds data up to here
    published_at: datetime


@dataclass(frozen=True)
class Freshness:
    newest_boundary: datetime | None
    behind: dict[int, int] | None  # offsets from the newest boundary to the LSO (None: unknown)
    published: Published | None

    def describe(self, now: datetime) -> list[str]:
        if self.newest_boundary is None:
            return ["FRESHNESS no boundary frozen yet"]
        behind = (
            "unknown (Kafka did not answer)"
            if self.behind is None
            else ", ".join(f"p{p} {n}" for p, n in sorted(self.behind.items())) or "-"
        )
        lines = [
            f"FRESHNESS newest boundary {self.newest_boundary.isoformat()} "
            f"({ago(now - self.newest_boundary)}); offsets behind the LSO: {behind}"
        ]
        if self.published is None:
            lines.append("FRESHNESS no slice published yet")
        else:
            p = self.published
            lines.append(
                f"FRESHNESS newest published slice {p.slice_id}: data up to "
                f"{ago(now - p.end)}, published {ago(now - p.published_at)}"
            )
        return lines

    def to_json(self) -> dict:
        p = self.published
        return {
            "newest_boundary": self.newest_boundary.isoformat() if self.newest_boundary else None,
            "behind_last_stable": None
            if self.behind is None
            else {str(k): v for k, v in sorted(self.behind.items())},
            "newest_published": None
            if p is None
            else {
                "slice_id": p.slice_id,
                "end": p.end.isoformat(),
                "published_at": p.published_at.isoformat(),
            },
        }


def freshness(
    boundaries: list[Boundary], last_stable: Mapping[int, int] | None, published: list[Published]
) -> Freshness:
    """The lag of the newest boundary behind `last_stable` (None: unknown), and the newest
    published slice."""
    newest = max(boundaries, key=lambda b: b.at, default=None)
    behind = None
    if last_stable is not None:
        behind = {p: lso - (newest.offset(p) if newest else 0) for p, lso in last_stable.items()}
    return Freshness(
        newest.at if newest else None, behind, max(published, key=lambda s: s.end, default=None)
    )


def ago(age: timedelta) -> str:
    minutes = int(age.total_seconds() // 60)
    if minutes < 0:
        return "in the future"
    if minutes < 120:
        return f"{minutes} min ago"
    return f"{minutes // 60} h {minutes % 60} min ago"
