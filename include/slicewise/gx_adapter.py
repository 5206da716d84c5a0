"""Run a Great Expectations (1.x) suite on a Spark DataFrame and fail an Airflow task readably.

Each call builds a fresh *ephemeral* GX context: nothing lands in the repo (no `gx/`) and
repeated calls never collide on names. Only the Data Docs site and the JSON it is rendered
from (`docs_dir/_gx_store/`) go to disk, because GX's site builder deletes every page whose
source result it cannot find: an in-memory store would wipe earlier runs' pages. The
site keeps the newest `KEPT_RESULTS` validations (every one is kept in the lakehouse).
That store and the site are shared by every gate of a pipeline, so a validation holds an
exclusive lock on the docs folder: two gates at once (a backfill's runs side by side)
would otherwise read each other's half-written suite files and fail. The wait is bounded:
a holder may be frozen rather than slow (a zombie attempt), and the verdict must not wait
on the report, so past `LOCK_WAIT_SECONDS` a gate writes its Data Docs to a site of its
own beside the shared one and says so in the log.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlparse

# This module is the one that imports Great Expectations (`gate` takes `gxe` from
# here), so the settings below come before GX's import on every path.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # before GX is imported: no telemetry
# Before the import too: importing GX logs hundreds of INFO lines about its own decorators.
if logging.getLogger("great_expectations").level == logging.NOTSET:  # keep an explicit app choice
    logging.getLogger("great_expectations").setLevel(logging.WARNING)

import great_expectations as gx  # noqa: E402
import great_expectations.expectations as gxe  # noqa: E402
import pandas as pd  # noqa: E402
from great_expectations.checkpoint import UpdateDataDocsAction  # noqa: E402
from great_expectations.core.expectation_validation_result import ExpectationValidationResult  # noqa: E402
from great_expectations.data_context.types.base import (  # noqa: E402
    DataContextConfig,
    InMemoryStoreBackendDefaults,
    ProgressBarsConfig,
)
from pyspark.sql import DataFrame  # noqa: E402

SITE_NAME = "local_site"
# The local site keeps the newest validations only: its index loads every result the
# store holds, so a store that only grew made each gate slower with the pipeline's age
# (bench/results/NOTES.md, 2026-12-05 evening). Every page and result is kept in the
# lakehouse (`data_docs.keep`), where `slicewise docs --slice-id` finds it.
KEPT_RESULTS = 100
SAMPLE_SIZE = 20  # offending values kept per failed expectation
LOCK_WAIT_SECONDS = 60.0  # a pandas validation holds the lock for about a second
log = logging.getLogger(__name__)
_LOCK = threading.Lock()  # gx.get_context() swaps a process-wide "current context"


@dataclass(frozen=True)
class GateFailure:
    """One failed expectation, reduced to what a person needs to start debugging."""

    expectation_type: str
    column: str | None
    unexpected_count: int | None
    sample: list[Any]
    observed: Any = None
    error: str | None = None  # set when the expectation itself raised (e.g. missing column)

    def describe(self) -> str:
        """One line for the task log, e.g. `expect_x(col): 3 unexpected, e.g. ['a']`."""
        head = f"{self.expectation_type}({self.column})" if self.column else self.expectation_type
        if self.error:
            return f"{head}: raised {self.error}"
        parts = [] if self.unexpected_count is None else [f"{self.unexpected_count} unexpected"]
        if self.sample:  # distinct values only: a duplicated key shows up once per row
            parts.append(f"e.g. {list({repr(v): v for v in self.sample}.values())[:5]!r}")
        if self.observed is not None:
            parts.append(f"observed {self.observed!r}")
        return f"{head}: " + (", ".join(parts) or "failed")


@dataclass(frozen=True)
class GateReport:
    """Outcome of one validation; `summary()` is what ends up in the Airflow log."""

    success: bool
    suite_name: str
    run_name: str
    evaluated: int
    failures: list[GateFailure]
    docs_index: Path  # the page, in the local `site` GX rendered
    site: Path
    docs_url: str | None = None  # where the page is kept for every host (slicewise.data_docs)

    def summary(self) -> str:
        """Multi-line text on failure, one line on success."""
        where = f"{self.suite_name}/{self.run_name}"
        docs = f"Data Docs: {self.docs_url or self.docs_index.as_uri()}"
        if self.success:
            return f"gate passed for {where}: all {self.evaluated} expectations met ({docs})"
        head = (
            f"gate FAILED for {where}: {len(self.failures)} of {self.evaluated} expectations failed"
        )
        return "\n".join([head, *(f" - {f.describe()}" for f in self.failures), docs])


def validate(
    df: DataFrame | pd.DataFrame,
    suite_name: str,
    expectations: list[gxe.Expectation],
    docs_dir: Path,
    run_name: str,
) -> GateReport:
    """Validate `df` against `expectations`, render Data Docs into `docs_dir`, report back.

    Expectations are copied because GX stamps an id on one when it joins a suite and then
    refuses to add it to another. GX persists a Spark DataFrame while validating (many
    metric passes); we unpersist afterwards unless the caller had cached it already.
    A pandas DataFrame (facts already computed, e.g. by one Spark aggregation) is
    validated in this process, without a Spark job.
    """
    docs_dir = Path(docs_dir).resolve()
    on_spark = not isinstance(df, pd.DataFrame)
    was_cached = on_spark and df.is_cached
    try:
        with _LOCK, _site_for(docs_dir, run_name) as site:
            context = gx.get_context(mode="ephemeral", project_config=_context_config(site))
            source = (
                context.data_sources.add_spark(name="slicewise")
                if on_spark
                else context.data_sources.add_pandas(name="slicewise")
            )
            batch = source.add_dataframe_asset(
                name="dataframe"
            ).add_batch_definition_whole_dataframe(name="whole_dataframe")
            copies = [e.copy(update={"id": None}, deep=True) for e in expectations]
            suite = context.suites.add_or_update(
                gx.ExpectationSuite(name=_key_safe(suite_name), expectations=copies)
            )
            definition = context.validation_definitions.add(
                gx.ValidationDefinition(name=suite.name, data=batch, suite=suite)
            )
            checkpoint = context.checkpoints.add(
                gx.Checkpoint(
                    name=suite.name,
                    validation_definitions=[definition],
                    actions=[UpdateDataDocsAction(name="update_data_docs", site_names=[SITE_NAME])],
                    result_format={
                        "result_format": "SUMMARY",
                        "partial_unexpected_count": SAMPLE_SIZE,
                    },
                )
            )
            run_id = gx.RunIdentifier(
                run_name=_key_safe(run_name), run_time=dt.datetime.now(dt.timezone.utc)
            )
            _forget_old_results(site)
            outcome = checkpoint.run(batch_parameters={"dataframe": df}, run_id=run_id)
            ((key, result),) = outcome.run_results.items()
            urls = context.get_docs_sites_urls(resource_identifier=key, site_name=SITE_NAME)
    finally:
        if on_spark and not was_cached and df.is_cached:
            df.unpersist()

    url = urls[0].get("site_url") if urls else None
    page = Path(unquote(urlparse(url).path)) if url and url.startswith("file://") else None
    return GateReport(
        success=bool(result.success),
        suite_name=suite_name,
        run_name=run_name,
        evaluated=len(result.results),
        failures=[_to_failure(r) for r in result.results if not r.success],
        docs_index=page if page is not None and page.exists() else site / "index.html",
        site=site,
    )


@contextmanager
def _site_for(docs_dir: Path, run_name: str) -> Iterator[Path]:
    """The Data Docs folder this validation writes to, held exclusively: the pipeline's
    shared site, or, when another process holds it past LOCK_WAIT_SECONDS, a fresh site
    of this run's own in `<docs_dir>.apart/`. GX's file stores rewrite a suite in place,
    so a concurrent reader can see it empty."""
    docs_dir.mkdir(parents=True, exist_ok=True)
    with open(docs_dir / ".slicewise.lock", "a") as handle:
        if _lock(handle, LOCK_WAIT_SECONDS):
            yield docs_dir  # unlocked when the handle closes, by a killed holder too
            return
    stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S%fZ}-{os.getpid()}"
    apart = docs_dir.with_name(f"{docs_dir.name}.apart") / f"{_key_safe(run_name)}-{stamp}"
    log.warning(
        "%s stayed locked by another gate for %.0f s; the Data Docs of %s go to %s instead "
        "(the verdict does not depend on where they are written)",
        docs_dir, LOCK_WAIT_SECONDS, run_name, apart,
    )  # fmt: skip
    yield apart


def _forget_old_results(site: Path) -> None:
    """Delete all but the newest `KEPT_RESULTS` - 1 results of the local site, with
    their pages and the folders they leave empty, so this validation's is among the
    newest `KEPT_RESULTS` and a gate lists and loads a bounded number of files."""
    results, pages = site / "_gx_store" / "validations", site / "validations"
    found = sorted(results.rglob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in found[: max(0, len(found) - (KEPT_RESULTS - 1))]:
        page = pages / old.relative_to(results).with_suffix(".html")
        for path, root in ((old, results), (page, pages)):
            path.unlink(missing_ok=True)
            while path.parent != root and path.parent.is_dir() and not any(path.parent.iterdir()):
                path.parent.rmdir()
                path = path.parent


def _lock(handle: IO[str], wait: float) -> bool:
    """An exclusive `flock` on `handle` within `wait` seconds, or False."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)


def _context_config(docs_dir: Path) -> DataContextConfig:
    """In-memory context, except suites and results, kept next to the docs they feed."""
    defaults = InMemoryStoreBackendDefaults()
    stores = dict(defaults.stores)
    for name, kind, folder in (
        (defaults.expectations_store_name, "ExpectationsStore", "expectations"),
        (defaults.validation_results_store_name, "ValidationResultsStore", "validations"),
    ):
        backend = {
            "class_name": "TupleFilesystemStoreBackend",
            "base_directory": str(docs_dir / "_gx_store" / folder),
        }
        stores[name] = {"class_name": kind, "store_backend": backend}
    site = {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,  # no "getting started" call-to-action links
        "store_backend": {
            "class_name": "TupleFilesystemStoreBackend",
            "base_directory": str(docs_dir),
        },
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }
    return DataContextConfig(
        store_backend_defaults=defaults,
        stores=stores,
        data_docs_sites={SITE_NAME: site},
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),  # no tqdm bars in task logs
    )


def _to_failure(result: ExpectationValidationResult) -> GateFailure:
    """Pull the offending values / observed value out of one expectation result."""
    config = result.expectation_config
    kwargs: dict[str, Any] = dict(config.kwargs) if config else {}
    columns = [kwargs[k] for k in ("column", "column_A", "column_B") if kwargs.get(k)]
    columns += list(kwargs.get("column_list") or [])
    details: dict[str, Any] = result.result or {}
    return GateFailure(
        expectation_type=config.type if config else "unknown_expectation",
        column=", ".join(map(str, columns)) or None,
        unexpected_count=details.get("unexpected_count"),
        sample=[_plain(v) for v in (details.get("partial_unexpected_list") or [])[:SAMPLE_SIZE]],
        observed=details.get("observed_value"),
        error=_exception_message(result.exception_info),
    )


def _plain(value: Any) -> Any:
    """Python values for numpy ones (a pandas-validated frame's samples), so a report
    reads `(3, 4)`, not `(np.int64(3), np.int64(4))`."""
    if isinstance(value, tuple | list):
        return type(value)(_plain(v) for v in value)
    return value.item() if hasattr(value, "item") and hasattr(value, "dtype") else value


def _exception_message(info: Any) -> str | None:
    """exception_info is either flat or keyed by the metric that raised; find the message."""
    if not isinstance(info, dict):
        return None
    for entry in [info] if "raised_exception" in info else list(info.values()):
        if isinstance(entry, dict) and entry.get("raised_exception"):
            return str(entry.get("exception_message") or "exception")
    return None


def _key_safe(name: str) -> str:
    """GX file stores reject path separators inside key parts."""
    return name.replace("/", "_").replace("\\", "_")
