"""The demo's runs are the timetable's own: a scheduler started after them carries on.

`make demo` backfills its hours through `AirflowServices`, as here. Runs made with
`airflow dags test` for an interval carried the interval's *end* as their logical
date, the one the timetable gives the next interval: a scheduler started afterwards
logged "run already exists" once a second and never moved on.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from test_airflow_e2e import produce_hour  # same folder, on sys.path under pytest

from slicewise.ledger import Ledger
from slicewise_dev.airflow_env import VENV_BIN, airflow_env
from slicewise_dev.airflow_services import DAG_ID, AirflowServices

pytestmark = pytest.mark.integration


def test_after_a_backfill_of_the_latest_hours_the_scheduler_schedules_the_next(pipeline, tmp_path):
    settings, producer = pipeline
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=2)
    produce_hour(producer, start)
    home = tmp_path / "airflow"
    env = {
        **airflow_env(settings),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db?timeout=60",
        "SLICEWISE_GRACE_SECONDS": "0",
    }
    with AirflowServices(env, tmp_path / "logs") as services:
        runs = services.backfill(start, end, max_active_runs=2)
        assert {r.state for r in runs.values()} == {"success"}, runs
        # The timetable's logical dates: each interval's start.
        assert sorted(runs) == [start, start + timedelta(hours=1)]
        assert [(s.start, s.end) for s in Ledger(settings.ledger_dir, settings.topic).slices()] == [
            (start, start + timedelta(hours=1)),
            (start + timedelta(hours=1), end),
        ]

        # A scheduler with its own timetable on, as `make airflow-ui` runs it, for a few loops.
        scheduler = subprocess.run(
            [str(VENV_BIN / "airflow"), "scheduler", "--num-runs", "5"],
            env={**services.env, "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        log = scheduler.stdout + scheduler.stderr
        assert scheduler.returncode == 0, log[-3000:]
        with services.db.connect() as conn:
            next_run = conn.scalar(
                text("SELECT next_dagrun FROM dag WHERE dag_id = :dag"), {"dag": DAG_ID}
            )
            kinds = conn.execute(
                text("SELECT run_type FROM dag_run WHERE dag_id = :dag"), {"dag": DAG_ID}
            ).all()
    # It moved past the backfilled hours to the one still open, and ran none of them again.
    assert datetime.fromisoformat(next_run).replace(tzinfo=UTC) == end, log[-3000:]  # SQLite text
    assert sorted(k for (k,) in kinds) == ["backfill", "backfill"]
    assert log.count("run already exists") <= 1, log[-3000:]
