"""The maintenance policy: its definition keys, the VACUUM retention's floor, the
settled event dates and the retention properties stated on the tables."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest

from slicewise.config import ConfigError, load_settings, step_timeout
from slicewise.errors import OperationalError
from slicewise.maintenance import (
    RetentionTooShort,
    check_retention,
    retention_properties,
    settled_before,
)
from slicewise.pipelines import Maintenance, PipelineDefinitionError, load_pipelines

DEFINITION = """pipelines:
  fast:
    topic: t
    key: [id]
    event_time: at
    fields:
      id: {type: string, required: true}
      at: {type: timestamp, required: true}
    maintenance:
"""


def test_the_defaults_keep_a_week_of_files_and_all_of_bronze_daily():
    policy = Maintenance()
    assert policy.schedule == "@daily"
    assert policy.vacuum_retain == timedelta(days=7) and policy.bronze_retain is None
    assert step_timeout({}) == timedelta(hours=2)
    check_retention(policy, step_timeout({}), "events")  # the defaults agree


def test_a_definition_sets_maintenance_and_a_bad_key_names_its_line(tmp_path):
    path = tmp_path / "pipelines.yaml"
    path.write_text(
        DEFINITION + "      schedule: 6h\n      vacuum_retain: 3d\n      bronze_retain: 30d\n"
    )
    policy = load_pipelines(path)["fast"].maintenance
    assert policy.schedule == "0 */6 * * *"
    assert policy.vacuum_retain == timedelta(days=3)
    assert policy.bronze_retain == timedelta(days=30)
    path.write_text(DEFINITION + "      vacuum_retain: a week\n")
    with pytest.raises(PipelineDefinitionError, match=r"pipelines.yaml:10 .*vacuum_retain.*7d"):
        load_pipelines(path)
    path.write_text(DEFINITION + "      vacuum: 3d\n")
    with pytest.raises(PipelineDefinitionError, match="maintenance.vacuum: unknown key"):
        load_pipelines(path)


def test_a_retention_shorter_than_a_step_may_run_is_refused_naming_both_settings():
    policy = Maintenance(vacuum_retain="1h")
    with pytest.raises(RetentionTooShort) as refused:
        check_retention(policy, timedelta(hours=2), "events")
    assert isinstance(refused.value, OperationalError)  # the CLI prints it, no traceback
    message = str(refused.value)
    assert "maintenance.vacuum_retain" in message and "SLICEWISE_STEP_TIMEOUT" in message
    check_retention(policy, timedelta(hours=1), "events")  # equal is enough


@pytest.mark.parametrize(
    ("given", "span"), [("90m", timedelta(minutes=90)), ("30s", timedelta(seconds=30))]
)
def test_the_step_timeout_is_a_duration(given, span, tmp_path):
    assert step_timeout({"SLICEWISE_STEP_TIMEOUT": given}) == span
    settings = load_settings(
        {"SLICEWISE_STATE_DIR": str(tmp_path), "SLICEWISE_STEP_TIMEOUT": given}
    )
    assert settings.step_timeout == span
    with pytest.raises(ConfigError, match="SLICEWISE_STEP_TIMEOUT 'two hours'"):
        step_timeout({"SLICEWISE_STEP_TIMEOUT": "two hours"})


def test_silver_dates_settle_a_day_past_the_horizon():
    now = datetime(2026, 11, 27, 0, 30, tzinfo=timezone.utc)
    assert settled_before(now, 7) == date(2026, 11, 19)
    assert settled_before(now, 0) == date(2026, 11, 26)


def test_the_tables_state_vacuums_retention_and_keep_the_log_at_least_as_long():
    week = retention_properties(Maintenance())
    assert week == {
        "delta.deletedFileRetentionDuration": "interval 604800 seconds",
        "delta.logRetentionDuration": "interval 2592000 seconds",  # Delta's 30 days
        "delta.setTransactionRetentionDuration": "interval 604800 seconds",
    }
    quarter = retention_properties(Maintenance(vacuum_retain="90d"))
    assert quarter["delta.logRetentionDuration"] == "interval 7776000 seconds"
