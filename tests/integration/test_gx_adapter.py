"""The GX gate wrapper against a real local SparkSession (no broker, no Delta needed)."""

from __future__ import annotations

import fcntl
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import great_expectations.expectations as gxe
import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession

from slicewise import gx_adapter
from slicewise.gx_adapter import GateFailure, GateReport, validate

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """Reuse a session another module left active; otherwise own (and stop) a small one,
    so a later module's getOrCreate() does not silently inherit our Delta-less session."""
    active = SparkSession.getActiveSession()
    session = active or (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    if active is None:
        session.stop()


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One Data Docs site shared by every test here, as a DAG's gates would share one."""
    return tmp_path_factory.mktemp("gate_docs") / "site"


@pytest.fixture(autouse=True)
def no_gx_folder_and_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run from an empty CWD and refuse non-loopback connections: GX must neither scaffold
    a `gx/` project nor phone home."""
    monkeypatch.chdir(tmp_path)
    real_connect = socket.socket.connect

    def loopback_only(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            if host not in ("localhost", "::1") and not str(host).startswith("127."):
                raise AssertionError(f"unexpected network connection to {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    yield
    assert not (tmp_path / "gx").exists()


def events(spark: SparkSession, ids: list[str | None]) -> DataFrame:
    return spark.createDataFrame([(i, n) for n, i in enumerate(ids)], "event_id string, n long")


def event_expectations() -> list[gxe.Expectation]:
    return [
        gxe.ExpectColumnToExist(column="event_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="event_id"),
        gxe.ExpectColumnValuesToBeUnique(column="event_id"),
        gxe.ExpectColumnValuesToMatchRegex(column="event_id", regex=r"^e-"),
        gxe.ExpectColumnValuesToBeBetween(column="n", min_value=0),
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
    ]


def failure(report: GateReport, expectation_type: str) -> GateFailure:
    (match,) = [f for f in report.failures if f.expectation_type == expectation_type]
    return match


def test_unique_ids_pass(spark: SparkSession, docs_dir: Path) -> None:
    report = validate(
        events(spark, [f"e-{i}" for i in range(1000)]),
        "events",
        event_expectations(),
        docs_dir,
        "ok",
    )
    assert report.success, report.summary()
    assert report.failures == []
    assert report.evaluated == 6
    assert (docs_dir / "index.html").exists()
    assert report.docs_index.exists() and report.docs_index.suffix == ".html"
    assert report.summary().count("\n") == 0 and "passed" in report.summary()


def test_duplicate_id_fails_with_offending_value(spark: SparkSession, docs_dir: Path) -> None:
    ids = [f"e-{i}" for i in range(100)] + ["e-dup", "e-dup"]
    report = validate(events(spark, ids), "events", event_expectations(), docs_dir, "dup")
    assert not report.success
    assert [f.expectation_type for f in report.failures] == ["expect_column_values_to_be_unique"]
    unique = failure(report, "expect_column_values_to_be_unique")
    assert unique.column == "event_id"
    assert unique.unexpected_count == 2
    assert "e-dup" in unique.sample
    assert report.docs_index.is_relative_to(docs_dir.resolve()) and report.docs_index.exists()
    summary = report.summary()
    assert summary.startswith("gate FAILED for events/dup: 1 of 6 expectations failed")
    assert "e-dup" in summary and "Data Docs: file://" in summary


def test_table_level_counts(spark: SparkSession, docs_dir: Path) -> None:
    checks = [
        gxe.ExpectColumnPairValuesToBeEqual(column_A="read", column_B="accounted"),
        gxe.ExpectTableRowCountToEqual(value=1),
    ]
    counts = "read long, accounted long"

    short = validate(spark.createDataFrame([(10, 9)], counts), "counts", checks, docs_dir, "short")
    assert not short.success
    pair = failure(short, "expect_column_pair_values_to_be_equal")
    assert pair.column == "read, accounted" and pair.unexpected_count == 1
    assert pair.sample == [(10, 9)]

    even = validate(spark.createDataFrame([(10, 10)], counts), "counts", checks, docs_dir, "even")
    assert even.success, even.summary()

    two_rows = validate(
        spark.createDataFrame([(1, 1), (2, 2)], counts), "counts", checks, docs_dir, "rows"
    )
    rows = failure(two_rows, "expect_table_row_count_to_equal")
    assert rows.observed == 2 and rows.unexpected_count is None
    assert "observed 2" in two_rows.summary()


def test_facts_in_pandas_are_validated_like_a_spark_frame(docs_dir: Path) -> None:
    """The gate's one-row frame of facts, in pandas: the same report and Data Docs."""
    checks = [
        gxe.ExpectColumnPairValuesToBeEqual(column_A="read", column_B="accounted"),
        gxe.ExpectColumnValuesToBeBetween(column="duplicate_event_ids", min_value=0, max_value=0),
    ]
    bad = validate(
        pd.DataFrame([{"read": 10, "accounted": 9, "duplicate_event_ids": 2}]),
        "facts",
        checks,
        docs_dir,
        "bad-facts",
    )
    assert not bad.success and bad.evaluated == 2 and len(bad.failures) == 2
    assert failure(bad, "expect_column_pair_values_to_be_equal").sample == [(10, 9)]
    assert failure(bad, "expect_column_values_to_be_between").sample == [2]
    assert bad.docs_index.exists() and "bad-facts" in str(bad.docs_index)
    good = validate(
        pd.DataFrame([{"read": 10, "accounted": 10, "duplicate_event_ids": 0}]),
        "facts",
        checks,
        docs_dir,
        "good-facts",
    )
    assert good.success, good.summary()


def test_repeated_validations_keep_every_run(spark: SparkSession, docs_dir: Path) -> None:
    shared = event_expectations()  # the same Expectation objects, reused on purpose
    first = validate(
        events(spark, ["e-1", "e-2"]),
        "repeat_a",
        shared,
        docs_dir,
        "scheduled__2026-11-01T00:00:00+00:00",
    )
    second = validate(events(spark, ["e-3", None]), "repeat_b", shared, docs_dir, "manual/2")
    assert first.success and not second.success
    assert failure(second, "expect_column_values_to_not_be_null").unexpected_count == 1
    assert first.docs_index != second.docs_index
    assert first.docs_index.exists() and second.docs_index.exists()
    index = (docs_dir / "index.html").read_text()
    for suite in ("repeat_a", "repeat_b", "events", "counts"):  # earlier tests' runs survive
        assert f"validations/{suite}/" in index


def test_the_local_site_keeps_the_newest_results_only(tmp_path: Path, monkeypatch) -> None:
    """A gate's cost may not grow with the pipeline's age: the local site keeps the
    newest `KEPT_RESULTS` results and pages, and no folder the older ones left."""
    monkeypatch.setattr(gx_adapter, "KEPT_RESULTS", 3)
    suite = [gxe.ExpectColumnValuesToBeBetween(column="read", min_value=0)]
    for n in range(5):
        validate(pd.DataFrame([{"read": n}]), "slice_facts", suite, tmp_path, f"slice-{n}")
    results = tmp_path / "_gx_store" / "validations" / "slice_facts"
    pages = tmp_path / "validations" / "slice_facts"
    for folder, suffix in ((results, ".json"), (pages, ".html")):
        assert sorted(p.name for p in folder.iterdir()) == ["slice-2", "slice-3", "slice-4"]
        assert len(list(folder.rglob(f"*{suffix}"))) == 3
    index = (tmp_path / "index.html").read_text()
    assert "slice-4" in index and "slice-0" not in index


def test_missing_column_is_reported_not_raised(spark: SparkSession, docs_dir: Path) -> None:
    report = validate(
        events(spark, ["e-1"]),
        "broken",
        [gxe.ExpectColumnValuesToNotBeNull(column="nope")],
        docs_dir,
        "r",
    )
    (broken,) = report.failures
    assert broken.error and "nope" in broken.error
    assert "nope" in report.summary()


GATE_PROCESS = """
import sys
import pandas as pd
from slicewise.gx_adapter import gxe, validate

docs, name, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
suite = [gxe.ExpectColumnValuesToBeBetween(column="read", min_value=0)]
for n in range(runs):
    report = validate(pd.DataFrame([{"read": n}]), "slice_facts", suite, docs, f"{name}-{n}")
    assert report.success, report.summary()
"""


def test_gates_in_separate_processes_share_one_site(tmp_path: Path) -> None:
    """A backfill runs gates side by side, each in its own task process, on one Data Docs
    folder. GX rewrites a suite's file in place; unlocked, one gate read the other's
    half-written suite and failed (`ExpectationSuite() argument after ** must be a
    mapping, not NoneType`, or `Store already has the following key`)."""
    site, runs = tmp_path / "site", 12
    gates = [
        subprocess.Popen(
            [sys.executable, "-c", GATE_PROCESS, str(site), name, str(runs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("first", "second", "third")
    ]
    outputs = [gate.communicate(timeout=300)[0] for gate in gates]
    assert [gate.returncode for gate in gates] == [0, 0, 0], "\n".join(o[-3000:] for o in outputs)
    index = (site / "index.html").read_text()
    pages = list((site / "validations" / "slice_facts").rglob("*.html"))
    assert len(pages) == 3 * runs and "validations/slice_facts/" in index


def test_a_gate_does_not_wait_on_a_frozen_holder_of_the_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie attempt frozen while it holds the lock (SIGSTOP in the chaos suite) held
    its retry for 900 s. Past the bounded wait, a gate gives the same verdict and writes
    its Data Docs to a site of its own, leaving the shared one to the holder."""
    monkeypatch.setattr(gx_adapter, "LOCK_WAIT_SECONDS", 1.0)
    site = tmp_path / "events"
    site.mkdir()
    suite = [gxe.ExpectColumnValuesToBeBetween(column="read", min_value=0, max_value=5)]
    with open(site / ".slicewise.lock", "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another open file: flock conflicts in-process too
        started = time.monotonic()
        report = validate(pd.DataFrame([{"read": 7}]), "slice_facts", suite, site, "slice-1")
        waited = time.monotonic() - started
    assert not report.success and report.failures[0].unexpected_count == 1
    assert 1.0 <= waited < 60, waited
    apart = tmp_path / "events.apart"
    assert report.docs_index.is_relative_to(apart) and report.docs_index.exists()
    assert not (site / "index.html").exists()  # the holder's site was not touched
    # Once the lock is free again, gates write to the shared site.
    shared = validate(pd.DataFrame([{"read": 1}]), "slice_facts", suite, site, "slice-2")
    assert shared.success and shared.docs_index.is_relative_to(site)
