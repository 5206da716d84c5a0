"""The UI paths on-call uses, in a real browser: Playwright driving Debian's Chromium
against our own api-server and scheduler (LocalExecutor, metadata on PostgreSQL), the
pipeline on the real broker, Spark Connect server and Delta tables.

PostgreSQL, not SQLite: the api-server creates a backfill in one transaction while the
scheduler writes, and on SQLite it answers 503 ("Backfill creation is not supported on
SQLite under concurrent access") when that transaction meets the scheduler's lock.

Log in; backfill two hours from the trigger dialog with Missing Runs, then with Missing
and Errored Runs once one of them errored (it reruns that one, not the other); clear a
task with its downstream from a succeeded run's page. (All Runs is the
same rerun of a succeeded interval as the clear: `test_airflow_e2e.py` reruns whole
succeeded runs.) Then the tables, the ledger and the Asset
events must say that every slice was frozen once, ingested once and announced once.
A failing step leaves a screenshot in `.artifacts/browser/` (SLICEWISE_ARTIFACTS_DIR).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright
from sqlalchemy import text
from test_airflow_e2e import produce_hour, tables  # same folder, on sys.path under pytest

from slicewise.ledger import Ledger
from slicewise_dev.airflow_env import airflow_env
from slicewise_dev.airflow_services import DAG_ID, AirflowServices

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("SLICEWISE_ARTIFACTS_DIR", REPO / ".artifacts")) / "browser"
HOUR = timedelta(hours=1)
PASSWORD = "on-call-at-3am"


class UI:
    """The Airflow UI as on-call clicks it; each action screenshots the page if it fails."""

    def __init__(self, page, base: str) -> None:
        self.page, self.base = page, base

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        try:
            yield
        except Exception:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
            raise

    def log_in(self, user: str, password: str) -> None:
        with self.step("log-in"):
            self.page.goto(self.base + "/")
            self.page.get_by_label("Username").fill(user)
            self.page.get_by_label("Password").fill(password)
            self.page.get_by_role("button", name="Sign in").click()
            self.page.get_by_role("heading", name="Welcome").wait_for()

    def backfill(self, first: datetime, last: datetime, behaviour: str, expect_runs: int) -> None:
        """The trigger dialog's Backfill form: logical dates from `first` to `last`, both
        included, as the form counts them."""
        with self.step(f"backfill-{behaviour.replace(' ', '-').lower()}"):
            self.page.goto(f"{self.base}/dags/{DAG_ID}")
            self.page.get_by_role("button", name="Trigger Dag").click()
            dialog = self.page.get_by_role("dialog")
            dialog.get_by_text("Backfill", exact=True).click()
            day = self.page.get_by_placeholder("YYYY/MM/DD").filter(visible=True)
            time_of_day = self.page.get_by_placeholder("HH:mm").filter(visible=True)
            for field, at in enumerate((first, last)):
                self.page.get_by_test_id("datetime-input").nth(field).click()
                day.fill(f"{at:%Y/%m/%d}")
                time_of_day.fill(f"{at:%H:%M}")
                self.page.keyboard.press("Escape")  # closes the date picker, not the dialog
                expect(day).to_have_count(0)  # closed (it fades out), so the next is the one
            dialog.get_by_text(behaviour, exact=True).click()
            dialog.get_by_role("spinbutton").fill("2")  # Max Active Runs
            plural = "run" if expect_runs == 1 else "runs"
            dialog.get_by_text(f"{expect_runs} {plural} will be triggered").wait_for()
            dialog.get_by_role("button", name="Run Backfill").click()
            dialog.wait_for(state="hidden")

    def clear_with_downstream(self, run_id: str, task_id: str, affected: int) -> None:
        """A run's task page: clear the task and everything downstream of it."""
        with self.step(f"clear-{task_id}"):
            run = urllib.parse.quote(run_id)
            self.page.goto(f"{self.base}/dags/{DAG_ID}/runs/{run}/tasks/{task_id}")
            self.page.get_by_role("button", name="Press shift+c to clear").click()
            dialog = self.page.get_by_role("dialog")
            # Downstream is on by default; the count proves the downstream tasks are in.
            dialog.get_by_role("button", name=f"Affected Tasks: {affected}").wait_for()
            dialog.get_by_role("button", name="Confirm").click()
            dialog.wait_for(state="hidden")


@pytest.fixture
def browser_page() -> Iterator:
    chromium = os.environ.get("SLICEWISE_CHROMIUM") or shutil.which("chromium")
    assert chromium, (
        "Chromium is not installed: `bash scripts/test_packages.sh` (run by `make test`) "
        "installs Debian's chromium"
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


def mark_failed(services: AirflowServices, run_id: str) -> None:
    """PATCH the run's state through the REST API, as the admin user (a JWT from /auth/token)."""
    base = f"http://127.0.0.1:{services.port}"

    def call(path: str, body: dict, method: str, headers: dict[str, str]) -> dict:
        headers = {"Content-Type": "application/json", **headers}
        request = urllib.request.Request(base + path, json.dumps(body).encode(), headers)
        request.method = method
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    login = {"username": "admin", "password": PASSWORD}
    token = call("/auth/token", login, "POST", {})["access_token"]
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{urllib.parse.quote(run_id)}"
    run = call(path, {"state": "failed"}, "PATCH", {"Authorization": f"Bearer {token}"})
    assert run["state"] == "failed", run


def run_ids(services: AirflowServices) -> dict[datetime, str]:
    with services.db.connect() as conn:
        rows = conn.execute(
            text("SELECT logical_date, run_id FROM dag_run WHERE dag_id = :dag"), {"dag": DAG_ID}
        ).all()
    return {datetime.fromisoformat(str(at)).replace(tzinfo=timezone.utc): rid for at, rid in rows}


def tries(services: AirflowServices, run_id: str) -> dict[str, int]:
    with services.db.connect() as conn:
        rows = conn.execute(
            text("SELECT task_id, try_number FROM task_instance WHERE run_id = :run"),
            {"run": run_id},
        ).all()
    return dict(rows)


def wait_for_run(
    services: AirflowServices, at: datetime, started_after: datetime, timeout: float = 600
) -> str:
    """The state of the run of `at` once a start later than `started_after` has ended.

    The UI closes its clear dialog before the clear is committed, so right after it
    the run can still read as the finished run the clear replaces; a clear restarts
    it (Airflow sets the run's start date), which tells the two apart."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = services.runs()[0][at]
        if run.started and run.started > started_after and run.state in ("success", "failed"):
            return run.state
        time.sleep(2)
    raise AssertionError(f"the run of {at} did not finish: {services.tail()}")


def test_backfills_and_a_clear_from_the_ui_run_each_slice_once(
    spark, pipeline, postgres_url, tmp_path, browser_page
):
    settings, producer = pipeline
    h0 = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - 4 * HOUR
    hours = [h0, h0 + HOUR]
    end = hours[-1] + HOUR
    for n, start in enumerate(hours):
        produce_hour(producer, start, prefix=f"h{n}-")
    home = tmp_path / "airflow"
    home.mkdir()
    (home / "passwords.json").write_text(json.dumps({"admin": PASSWORD}))
    env = {
        **airflow_env(settings),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_url,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "SLICEWISE_GRACE_SECONDS": "0",
    }
    ledger = Ledger.of(settings)
    with AirflowServices(env, tmp_path / "logs") as services:
        ui = UI(browser_page, f"http://127.0.0.1:{services.port}")
        ui.log_in("admin", PASSWORD)

        # Missing Runs over both hours: one run each.
        ui.backfill(hours[0], hours[1], "Missing Runs", expect_runs=2)
        first = services.wait_for_backfill(hours[0], end)
        assert {r.state for r in first.values()} == {"success"}, services.tail()
        boundaries = ledger.boundaries()

        # The second hour's run errored (marked failed, as on-call does for a bad run):
        # Missing and Errored Runs over both reruns it, not the first.
        ids = run_ids(services)
        mark_failed(services, ids[hours[1]])
        ui.backfill(hours[0], hours[1], "Missing and Errored Runs", expect_runs=1)
        second = services.wait_for_backfill(hours[0], end, until_closed=False)  # the last
        assert {r.state for r in second.values()} == {"success"}, services.tail()
        assert second[hours[0]].started == first[hours[0]].started  # untouched
        assert second[hours[1]].started > first[hours[1]].started  # ran again
        settled = tables(spark, settings)

        # Clear ingest with its downstream (gate, publish, announce) on the first hour's
        # run, which succeeded and was left alone above: it runs again.
        run_id = run_ids(services)[hours[0]]
        finished = services.runs()[0][hours[0]].started
        ui.clear_with_downstream(run_id, "ingest", affected=4)
        assert wait_for_run(services, hours[0], started_after=finished) == "success", (
            services.tail()
        )
        assert {t: n for t, n in tries(services, run_id).items() if n > 1} == {
            "ingest": 2,
            "gate": 2,
            "publish": 2,
            "announce": 2,
        }
        events = {
            sl.slice_id: services.asset_events(settings.topic, sl.slice_id)
            for sl in ledger.slices()
        }

    # Each hour's slice was frozen once, and the reruns read it back unchanged.
    slices = ledger.slices()
    assert [(s.start, s.end) for s in slices] == [(h, h + HOUR) for h in hours]
    assert ledger.boundaries()[: len(boundaries)] == boundaries
    # Every event once in silver, every table row for row as before the reruns.
    assert tables(spark, settings) == settled
    silver_ids = sorted(row[0] for row in settled["silver"])
    assert silver_ids == sorted(f"h{n}-{i}" for n in range(len(hours)) for i in range(20))
    # Announced once per slice, with the counts of its first pass; reruns kept them.
    assert {slice_id: len(e) for slice_id, e in events.items()} == {s.slice_id: 1 for s in slices}
    for sl in slices:
        gate = ledger.step(sl.slice_id, "gate")
        assert gate["counts"]["read"] == 22 and gate["counts"]["inserted"] == 20
        assert all(r["counts"] is None for r in gate.get("rechecks", [])), gate  # same counts
