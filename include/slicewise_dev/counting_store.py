"""The ledger's real store with every call it serves counted: what the ledger-reads test
and the long-haul benchmark measure (reads and listings must not grow with history)."""

from __future__ import annotations

from collections import Counter
from typing import Any

COUNTED = ("read", "keys", "folders", "create", "replace", "delete")


class CountingStore:
    """Wraps a store (`slicewise.store`); `calls` counts each counted method's calls."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        served = getattr(self.store, name)
        if name not in COUNTED:
            return served

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return served(*args, **kwargs)

        return counted
