"""The gate's Data Docs, kept where the tables are, so any host can read them.

Great Expectations renders a site on local disk (`<state>/data_docs/<pipeline>/`, on
the host that ran the gate: with Celery or Kubernetes, a worker that may be gone by
morning). After each validation the gate copies its page, the result it was rendered
from (GX's JSON) and, once, the site's static files into the pipeline's folder of
the lakehouse (`<lakehouse>/<pipeline>/_data_docs/`, on object storage when the
tables are), under the same relative paths, and records the page's URL in the
ledger and the task log. `slicewise docs --slice-id ID` fetches a slice's pages from
there into a local folder to open in a browser. The site's index is not copied: a
worker's index lists only the validations that worker rendered.
"""

from __future__ import annotations

from pathlib import Path

from slicewise.config import Settings
from slicewise.errors import OperationalError
from slicewise.store import Store, open_store

FOLDER = "_data_docs"
STATIC = "static"
STATIC_DONE = f"{STATIC}/.slicewise-complete"  # written last: the static files are all there


def location(settings: Settings) -> str:
    """Where a pipeline's Data Docs are kept: a folder of its lakehouse."""
    return settings.table(FOLDER)


def keep(settings: Settings, site: Path, page: Path) -> str:
    """Copy one validation's page (rendered in the local `site`), its result and the
    site's static files into the lakehouse; the page's URL there."""
    store = open_store(location(settings))
    key = page.relative_to(site).as_posix()
    store.replace(key, page.read_bytes())
    result = site / "_gx_store" / Path(key).with_suffix(".json")
    if result.is_file():
        store.replace(
            f"_gx_store/{result.relative_to(site / '_gx_store').as_posix()}", result.read_bytes()
        )
    if store.read(STATIC_DONE) is None:
        for path in sorted((site / STATIC).rglob("*")):
            if path.is_file():
                store.replace(path.relative_to(site).as_posix(), path.read_bytes())
        store.replace(STATIC_DONE, b"")
    return url(settings, key)


def url(settings: Settings, key: str) -> str:
    return f"{location(settings).rstrip('/')}/{key}"


def fetch(settings: Settings, urls: list[str], into: Path) -> list[Path]:
    """The pages at `urls` (kept by `keep`) and the static files they link to, copied
    under `into` with the site's layout; the local pages, in order."""
    root = location(settings).rstrip("/") + "/"
    store = open_store(location(settings))
    pages = []
    for page_url in urls:
        if not page_url.startswith(root):
            raise OperationalError(
                f"{page_url} is not in this pipeline's Data Docs ({root}): it was written by a "
                "slicewise that kept them on the gate's host only"
            )
        pages.append(_copy(store, page_url[len(root) :], into))
    for key in store.keys(STATIC):
        _copy(store, key, into)
    return pages


def _copy(store: Store, key: str, into: Path) -> Path:
    data = store.read(key)
    if data is None:
        raise OperationalError(f"{key} is not in {store}: it was removed from the lakehouse")
    path = into / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
