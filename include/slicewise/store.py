"""Where the ledger's small JSON files live: a local folder, or an object store.

The ledger's guarantees need two operations of any store: `create`, which
writes a name only if it does not exist yet (so the first boundary written for
a time wins and is never rewritten), and `replace`, which swaps a whole object
at once (the latest outcome of a step); `delete` only forgets planning leases
expired long ago. A local folder does the first with a
hard link and the second with a rename, both fsynced. S3, GCS and Azure do the
first with a conditional put (`If-None-Match: *`) and the second with a plain
put, through obstore; S3-compatible servers must honour the condition atomically
(s3proxy with its filesystem-nio2 backend does, docs/DEPLOYING.md).

Object-store credentials and endpoints come from the environment the usual way
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
`GOOGLE_APPLICATION_CREDENTIALS`, `AZURE_STORAGE_ACCOUNT_NAME`, ...); nothing
here logs them.
"""

from __future__ import annotations

import bisect
import os
import tempfile
from pathlib import Path
from typing import Protocol

from slicewise.config import ConfigError

# Spark's Hadoop schemes, in the names obstore knows them by.
OBJECT_SCHEMES = {"s3a": "s3", "s3": "s3", "gs": "gs", "abfss": "abfss", "az": "az"}


class Store(Protocol):
    def read(self, key: str) -> bytes | None: ...

    def create(self, key: str, data: bytes) -> bool: ...

    def replace(self, key: str, data: bytes) -> None: ...

    def delete(self, key: str) -> None: ...

    def keys(
        self, prefix: str, after: str | None = None, limit: int | None = None
    ) -> list[str]: ...

    def folders(self, prefix: str) -> list[str]: ...


class LocalFolder:
    """A folder on local or mounted disk (the embedded default)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __str__(self) -> str:
        return str(self.root)

    def read(self, key: str) -> bytes | None:
        path = self.root / key
        return path.read_bytes() if path.exists() else None

    def create(self, key: str, data: bytes) -> bool:
        """Write `key` atomically; False (and no change) if it already exists."""
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        try:
            os.link(tmp.name, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp.name)

    def replace(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)

    def delete(self, key: str) -> None:
        """Remove `key`; nothing happens if it is not there."""
        (self.root / key).unlink(missing_ok=True)

    def keys(self, prefix: str, after: str | None = None, limit: int | None = None) -> list[str]:
        """Keys under `prefix` (recursively), in order; only those after `after` and at
        most `limit` of them when given, as an object store's listing from an offset."""
        folder = self.root / prefix
        if not folder.exists():
            return []
        # os.walk reads each folder's entry types from the listing itself: no stat per file.
        root = str(self.root) + os.sep
        found = sorted(
            os.path.join(path, name).removeprefix(root)
            for path, _, files in os.walk(folder)
            for name in files
            if not name.endswith(".tmp")
        )
        if after is not None:
            found = found[bisect.bisect_right(found, after) :]
        return found if limit is None else found[:limit]

    def folders(self, prefix: str) -> list[str]:
        """The folders directly under `prefix`, in order."""
        folder = self.root / prefix
        if not folder.exists():
            return []
        return sorted(f"{prefix}/{e.name}" for e in os.scandir(folder) if e.is_dir())


class ObjectStore:
    """A bucket and prefix on S3 (or an S3-compatible server), GCS or Azure, via obstore."""

    def __init__(self, url: str) -> None:
        from obstore.store import from_url

        scheme, rest = url.split("://", 1)
        self.url = url
        self._store = from_url(f"{OBJECT_SCHEMES[scheme]}://{rest}")

    def __str__(self) -> str:
        return self.url

    def read(self, key: str) -> bytes | None:
        import obstore

        try:
            return bytes(obstore.get(self._store, key).bytes())
        except FileNotFoundError:
            return None

    def create(self, key: str, data: bytes) -> bool:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            obstore.put(self._store, key, data, mode="create")
            return True
        except (AlreadyExistsError, PreconditionError):
            return False

    def replace(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self._store, key, data)

    def delete(self, key: str) -> None:
        """Remove `key`; nothing happens if it is not there (S3's delete is idempotent)."""
        import obstore

        try:
            obstore.delete(self._store, key)
        except FileNotFoundError:
            pass

    def keys(self, prefix: str, after: str | None = None, limit: int | None = None) -> list[str]:
        """Keys under `prefix`, in order; from `after` on and at most `limit` of them when
        given: then one listing request (S3's `start-after`), whatever the prefix holds."""
        import obstore

        listing = obstore.list(
            self._store, prefix.rstrip("/") + "/", offset=after, chunk_size=limit or 1000
        )
        if limit is None:
            return sorted(meta["path"] for meta in listing.collect())
        first = next(iter(listing), [])
        return sorted(meta["path"] for meta in first)[:limit]

    def folders(self, prefix: str) -> list[str]:
        """The folders directly under `prefix`, in order: one listing with a delimiter."""
        import obstore

        found = obstore.list_with_delimiter(self._store, prefix.rstrip("/") + "/")
        return sorted(p.rstrip("/") for p in found["common_prefixes"])


def open_store(location: str) -> Store:
    """The store for a ledger location: a path (or file: URL), or an object-store URL."""
    if location.startswith("file:"):
        return LocalFolder(Path("/" + location[len("file:") :].lstrip("/")))
    if "://" not in location:
        return LocalFolder(Path(location))
    scheme = location.split("://", 1)[0]
    if scheme not in OBJECT_SCHEMES:
        raise ConfigError(
            f"the offset ledger cannot live at {location}: use a local or mounted path, or an "
            f"object store URL ({', '.join(f'{s}://' for s in OBJECT_SCHEMES)}); set "
            "SLICEWISE_LEDGER_DIR or SLICEWISE_LAKEHOUSE."
        )
    return ObjectStore(location)
