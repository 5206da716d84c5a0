"""Airflow's components as processes of our own, and backfills run through them.

The api-server and the scheduler (LocalExecutor; a triggerer on request) share one
metadata DB, SQLite for the demo or PostgreSQL for the production-shaped test. Given
`celery`, the scheduler sends the tasks to a Celery worker instead (CeleryExecutor,
a Redis broker), which may run on another host (a namespace of slicewise_dev.netns):
it then reaches the api-server's execution API at `host`, where the api-server listens.
Runs are created with `airflow backfill create`, as the UI's backfill form does, so
they carry the timetable's own logical dates (an interval's start): a scheduler
started later on the same DB carries on after them, and a backfill over those
hours finds them instead of making a second run of the same slice.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import create_engine, text

from slicewise.connect_server import port_open
from slicewise_dev.airflow_env import VENV_BIN, migrate
from slicewise_dev.broker import free_ports
from slicewise_dev.netns import Hosts
from slicewise_dev.process import Child, wait_until

DAG_ID = "slicewise_events"
FINISHED = ("success", "failed")


def airflow(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        [str(VENV_BIN / "airflow"), *args], env=env, capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        raise RuntimeError(f"airflow {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout


def _utc(value: datetime | str | None) -> datetime | None:
    """A timestamp from the DB: PostgreSQL gives aware datetimes, SQLite naive UTC text."""
    if value is None:
        return None
    at = datetime.fromisoformat(value) if isinstance(value, str) else value
    return at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at.astimezone(timezone.utc)


@dataclass(frozen=True)
class Celery:
    """CeleryExecutor: its broker (and result backend), and the worker's host (None: here)."""

    broker_url: str
    worker_ns: str | None = None
    concurrency: int = 2


@dataclass(frozen=True)
class Run:
    logical_date: datetime
    state: str
    seconds: float | None  # from its start to its end, once it has ended
    started: datetime | None = None  # its latest start: a rerun moves it


def execution_api_ready(port: int, host: str = "127.0.0.1") -> bool:
    if not port_open(port, host):
        return False
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/execution/health", timeout=60):
            return True
    except OSError:
        return False


def command(component: list[str]) -> list[str]:
    """The scheduler starts with the steps' libraries imported (`slicewise.preloaded_scheduler`):
    its LocalExecutor forks every task from it."""
    if component[0] == "scheduler":
        return [str(VENV_BIN / "python"), "-m", "slicewise.preloaded_scheduler", *component[1:]]
    return [str(VENV_BIN / "airflow"), *component]


class AirflowServices:
    """api-server + scheduler (+ triggerer) on the metadata DB of `env`; a context manager."""

    def __init__(
        self,
        env: dict[str, str],
        logs: Path,
        triggerer: bool = False,
        dag_ids: tuple[str, ...] = (DAG_ID,),
        host: str = "127.0.0.1",
        celery: Celery | None = None,
        scheduled: bool = False,
    ) -> None:
        (self.port,) = free_ports(1)
        self.dag_ids = dag_ids
        self.scheduled = scheduled
        self.host = host
        self.celery = celery
        self.env = {
            **env,
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor" if celery else "LocalExecutor",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{host}:{self.port}/execution/",
            "AIRFLOW__API__HOST": host,
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            # Only the backfills run, unless `scheduled`: then the latest closed interval
            # of each DAG of `dag_ids` too (the others stay paused), as on a deployment.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(scheduled),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(scheduled),
        }
        self.logs = logs
        self.components = [["api-server", "--port", str(self.port)], ["scheduler"]]
        if triggerer:
            self.components.append(["triggerer"])
        if celery:
            self.env |= {
                "AIRFLOW__CELERY__BROKER_URL": celery.broker_url,
                "AIRFLOW__CELERY__RESULT_BACKEND": celery.broker_url,
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(celery.concurrency),
                # A task instance records the host it ran on: the worker's own address.
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": "slicewise_dev.netns.hostname",
            }
            self.components.append(["celery", "worker"])
        self.db = create_engine(self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        self._children: list[Child] = []

    def __enter__(self) -> AirflowServices:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 180) -> None:
        migrate(self.env)
        airflow(self.env, "dags", "reserialize")  # no dag-processor: the DAGs are parsed once
        if self.scheduled:  # else every DAG was created unpaused (an `airflow` call is ~3 s)
            for dag_id in self.dag_ids:
                airflow(self.env, "dags", "unpause", dag_id)
        self._children = [self._start(c) for c in self.components]
        # Ready once the execution API answers: its first request takes seconds (the app
        # is built lazily), which the first task would otherwise wait out.
        wait_until(
            lambda: execution_api_ready(self.port, self.host),
            self._children,
            "Airflow's api-server",
            timeout,
            interval=1,
        )

    def _start(self, component: list[str]) -> Child:
        argv = command(component)
        if component[0] == "celery" and self.celery and self.celery.worker_ns:
            argv = Hosts.command(self.celery.worker_ns, argv)
        log = self.logs / f"airflow-{component[0]}.log"
        if log.exists():  # a restarted component: its earlier log stays beside
            log.rename(log.with_suffix(f".{time.time_ns()}.log"))
        return Child(argv, log, env=self.env)

    def restart_worker(self) -> None:
        """A new Celery worker, after its host lost the last one (chaos: `worker-killed`)."""
        self._children = [c for c in self._children if c.log.stem != "airflow-celery"]
        self._children.append(self._start(["celery", "worker"]))

    def kill(self, component: str) -> None:
        """SIGKILL a component and every process it started, as a host lost (chaos)."""
        [child] = [c for c in self._children if c.log.stem == f"airflow-{component}"]
        child.kill()
        self._children.remove(child)

    def restart(self, component: list[str]) -> None:
        """Start a component again (after `kill`)."""
        self._children.append(self._start(component))

    def stop(self) -> None:
        """End every component and whatever it started (the executor's workers too)."""
        for child in self._children:
            child.stop(timeout=30)
        self._children = []
        self.db.dispose()

    def pid(self, component: str) -> int:
        """The process id of a running component ("scheduler", "api-server", ...)."""
        return next(c.pid for c in self._children if c.log.stem == f"airflow-{component}")

    def tail(self) -> str:
        return "\n".join(
            f"{p.name}:\n{p.read_text()[-3000:]}" for p in self.logs.glob("airflow-*.log")
        )

    def runs(self, dag_id: str = DAG_ID) -> tuple[dict[datetime, Run], bool]:
        """Every backfill run by logical date; and whether a backfill is still open.

        The scheduler closes a backfill a few loops after its last run ends, and Airflow
        refuses a second backfill of the same DAG until then.
        """
        with self.db.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT logical_date, state, start_date, end_date FROM dag_run"
                    " WHERE dag_id = :dag AND run_type = 'backfill'"
                ),
                {"dag": dag_id},
            ).all()
            still_open = conn.scalar(
                text("SELECT count(*) FROM backfill WHERE dag_id = :dag AND completed_at IS NULL"),
                {"dag": dag_id},
            )
        runs = {}
        for at, state, began, ended in rows:
            began, ended = _utc(began), _utc(ended)
            took = (ended - began).total_seconds() if began and ended else None
            runs[_utc(at)] = Run(_utc(at), str(state), took, began)
        return runs, still_open > 0

    def backfill(
        self,
        start: datetime,
        end: datetime,
        reprocess: str = "none",
        max_active_runs: int = 1,
        on_finished: Callable[[Run], None] | None = None,
        timeout: float = 1500,
        until_closed: bool = True,
        dag_id: str = DAG_ID,
        wait: bool = True,
        interval: timedelta = timedelta(hours=1),
    ) -> dict[datetime, Run]:
        """Backfill the intervals (hours by default) in [start, end); return once the backfill has completed
        (`wait=False`: at once, with no runs; `wait_for_backfill` waits).

        The CLI's dates are logical dates (interval starts), both ends included.
        `on_finished(run)` is called once for each run as it ends.
        """
        for attempt in range(1, 4):
            try:
                airflow(
                    self.env, "backfill", "create", "--dag-id", dag_id,
                    "--from-date", start.isoformat(),
                    "--to-date", (end - interval).isoformat(),
                    "--reprocess-behavior", reprocess, "--max-active-runs", str(max_active_runs),
                )  # fmt: skip
                break
            except RuntimeError as exc:
                # SQLite refuses a write at once (no busy wait) when the scheduler holds the
                # lock while this command upgrades its read transaction; the command rolled
                # back, so trying again is safe, unless a backfill did get created.
                if "database is locked" not in str(exc) or attempt == 3 or self.runs(dag_id)[1]:
                    raise
                time.sleep(2 * attempt)
        if not wait:
            return {}
        return self.wait_for_backfill(
            start, end, on_finished, timeout, until_closed, dag_id, interval
        )

    def wait_for_backfill(
        self,
        start: datetime,
        end: datetime,
        on_finished: Callable[[Run], None] | None = None,
        timeout: float = 1500,
        until_closed: bool = True,
        dag_id: str = DAG_ID,
        interval: timedelta = timedelta(hours=1),
    ) -> dict[datetime, Run]:
        """Wait until the open backfill has completed with a finished run for every interval in
        [start, end) (however it was created: the CLI, the UI); return those runs.

        The scheduler closes a backfill only every 30 s; until then Airflow refuses another
        one. `until_closed=False` returns as soon as every run has finished (the demo's
        one backfill does not need to wait for that)."""
        wanted = [start + k * interval for k in range(int((end - start) / interval))]
        told: set[datetime] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            all_runs, still_open = self.runs(dag_id)
            runs = {at: run for at, run in all_runs.items() if start <= at < end}
            for at, run in sorted(runs.items()):
                if run.state in FINISHED and at not in told and on_finished is not None:
                    told.add(at)
                    on_finished(run)
            # A reprocessed run is cleared back to queued before it runs again.
            done = sorted(runs) == wanted and all(r.state in FINISHED for r in runs.values())
            if done and (not still_open or not until_closed):
                return runs
            if not still_open and sorted(runs) != wanted:
                break  # the backfill closed without creating every run: waiting cannot help
            time.sleep(2)
        raise RuntimeError(f"backfill did not finish: {self.runs(dag_id)}\n{self.tail()}")

    def wait_for_scheduled_success(
        self, dag_id: str = DAG_ID, timeout: float = 300, at: datetime | None = None
    ) -> datetime:
        """The logical date of the DAG's first scheduled run to succeed (with `at`, once the
        run of that logical date has: a test crossing the hour also sees the scheduler run
        the hour that closed meanwhile, and that empty run may succeed first); fails on a
        failed one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.db.connect() as conn:
                runs = conn.execute(
                    text(
                        "SELECT logical_date, state FROM dag_run"
                        " WHERE dag_id = :dag AND run_type = 'scheduled' ORDER BY logical_date"
                    ),
                    {"dag": dag_id},
                ).all()
            assert all(str(state) != "failed" for _, state in runs), (runs, self.tail())
            done = [_utc(logical) for logical, state in runs if str(state) == "success"]
            if at is not None:
                done = [logical for logical in done if logical == at]
            if done:
                return done[0]
            time.sleep(3)
        raise AssertionError(f"no scheduled run of {dag_id} succeeded in {timeout} s")

    def task_hosts(self, dag_id: str = DAG_ID) -> dict[tuple[str, str], str]:
        """The host each task instance ran on, by (run id, task id)."""
        with self.db.connect() as conn:
            rows = conn.execute(
                text("SELECT run_id, task_id, hostname FROM task_instance WHERE dag_id = :dag"),
                {"dag": dag_id},
            ).all()
        return {(run, task): host for run, task, host in rows}

    def asset_events(self, topic: str, slice_id: str) -> list[dict]:
        with self.db.connect() as conn:
            extras = conn.scalars(text("SELECT extra FROM asset_event")).all()
        extras = [json.loads(e) if isinstance(e, str) else e for e in extras]
        return [e for e in extras if (e.get("topic"), e.get("slice_id")) == (topic, slice_id)]
