"""The planning lease: one planner at a time stores new boundaries, and a planner whose
lease was taken over stores none.

Two planners resolving non-adjacent new boundaries between the same neighbours see
neither's answer; with LSOs read at different moments they could store a pair that
contradicts (the later boundary below the earlier), and every plan of the two
intervals would then fail. So planners take turns, with nothing but the store's
create-if-absent:

* A lease is a numbered object, `planning/<generation>.json`; the holder is whoever
  created the highest generation. A planner takes the next generation when the
  highest is released or expired; of two taking it at once, one create wins.
* Before each boundary it stores, the holder creates the next intent of its
  generation (`planning/<generation>.<n>.intent`, the boundary itself). A planner
  taking over an expired lease first stores every intent its holder wrote (the same
  boundary, create-if-absent: whichever lands, it is the same) and then creates the
  next intent itself, as void. So the old holder, stalled past its lease and woken,
  fails to create that intent and stores nothing (`LeaseLost`): every boundary it
  stores is stored before the new holder resolves any.
* A holder also refuses an intent once its lease has expired by its own clock. Past
  the newest 16, a released generation is deleted; one taken over is kept an hour
  past its expiry (`FORGET_AFTER`), so only a planner stalled that long between
  reading the clock and one create could write past its void. The folder holds a
  few dozen objects, however many plans ran.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from slicewise.errors import OperationalError
from slicewise.store import Store

log = logging.getLogger(__name__)

FOLDER = "planning"
VOID = b"void"
FORGET_AFTER = timedelta(hours=1)
KEEP = 16  # generations kept whatever their state (`_forget`)
_GENERATION = re.compile(rf"^{FOLDER}/(\d{{12}})\.json$")


class LeaseLost(OperationalError):
    """The planning lease expired and another planner took it over before this planner
    stored its boundaries."""


def _lease_key(generation: int) -> str:
    return f"{FOLDER}/{generation:012d}.json"


def _intent_key(generation: int, n: int) -> str:
    return f"{FOLDER}/{generation:012d}.{n:06d}.intent"


@dataclass
class PlanningLease:
    store: Store
    generation: int
    expires_at: datetime
    intents: int = 0

    def intend(self, boundary: bytes) -> None:
        """Claim the store of one boundary under this lease; raises `LeaseLost` if the
        lease expired or was taken over (then nothing may be stored)."""
        if _now() >= self.expires_at or not self.store.create(
            _intent_key(self.generation, self.intents), boundary
        ):
            raise LeaseLost(
                f"the planning lease (generation {self.generation}) expired before this "
                "planner stored its boundaries, and another planner may hold it now; "
                "nothing more was stored by this one. Safe action: plan again (clear the "
                "`plan` task, or it retries on its own)."
            )
        self.intents += 1


def generations(store: Store) -> list[int]:
    """The lease generations kept in the store, oldest first."""
    found = (_GENERATION.match(k) for k in store.keys(FOLDER))
    return sorted(int(m.group(1)) for m in found if m)


@contextmanager
def planning_lease(
    store: Store, complete: Callable[[bytes], None], lease: timedelta = timedelta(seconds=45)
) -> Iterator[PlanningLease]:
    """Hold the next generation of the planning lease; `complete` stores a boundary an
    expired holder intended (`Ledger.put_boundary` of it)."""
    owner = uuid.uuid4().hex
    while True:
        kept = generations(store)
        latest = kept[-1] if kept else 0
        held = _read(store, _lease_key(latest)) if kept else None
        now = _now()
        if held is not None and not held.get("released"):
            if datetime.fromisoformat(held["expires_at"]) >= now:
                time.sleep(0.2)
                continue
            log.warning("planning lease of %s expired; taking it over", held["owner"])
            _void(store, latest, complete)
        payload = {"owner": owner, "expires_at": (now + lease).isoformat()}
        if store.create(_lease_key(latest + 1), json.dumps(payload).encode()):
            break
    holding = PlanningLease(store, latest + 1, now + lease)
    _forget(store, kept, now)
    try:
        yield holding
    finally:
        mine = _read(store, _lease_key(holding.generation))
        if mine is not None and mine["owner"] == owner:
            store.replace(
                _lease_key(holding.generation), json.dumps({**mine, "released": True}).encode()
            )


def _void(store: Store, generation: int, complete: Callable[[bytes], None]) -> None:
    """Store what an expired holder intended, then void its next intent."""
    n = 0
    while not store.create(_intent_key(generation, n), VOID):
        intended = store.read(_intent_key(generation, n))
        if intended == VOID:  # another planner taking over voided it first
            return
        if intended:
            complete(intended)
        n += 1


def _forget(store: Store, kept: list[int], now: datetime) -> None:
    """Delete the generations below the newest `KEEP` that were released (their holder
    stores nothing more), or that expired over `FORGET_AFTER` ago (voided: the void is
    kept that long against a holder stalled past its lease). The newest stay, so a
    listing that misses the objects created and deleted while it ran still finds one of
    them, and no planner takes a number taken before."""
    for generation in kept[:-KEEP]:
        held = _read(store, _lease_key(generation))
        if held is None:
            continue
        if not held.get("released"):
            if datetime.fromisoformat(held["expires_at"]) > now - FORGET_AFTER:
                continue
        prefix = f"{FOLDER}/{generation:012d}."
        for key in store.keys(FOLDER, after=prefix, limit=64):
            if not key.startswith(prefix):
                break
            if key.endswith(".intent"):
                store.delete(key)
        store.delete(_lease_key(generation))


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _read(store: Store, key: str) -> dict | None:
    data = store.read(key)
    return None if data is None else json.loads(data)
