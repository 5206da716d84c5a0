"""`make airflow-ui`'s environment runs every pipeline of the definition file, each
task on its own pipeline's topic (issue 49: with two pipelines every task failed,
because the environment carried the first pipeline's topic as SLICEWISE_TOPIC).

tests/integration/test_two_pipelines.py runs slices of two pipelines through Airflow
in this same environment."""

from __future__ import annotations

import os

import pytest

from slicewise.config import ConfigError, load_settings
from slicewise.home import REPO_ROOT
from slicewise.operators import task_settings
from slicewise.pipelines import load_pipelines
from slicewise_dev import airflow_env

TWO = REPO_ROOT / "docs" / "examples" / "two-pipelines.yaml"


def shell(tmp_path, **env: str) -> dict[str, str]:
    """A shell's environment for `make airflow-ui`, on a state folder of the test's own."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLICEWISE_")},
        "SLICEWISE_STATE_DIR": str(tmp_path / "state"),
        **env,
    }


def as_process_environment(monkeypatch, env: dict[str, str]) -> None:
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def make_airflow_ui(monkeypatch, environ: dict[str, str]) -> dict[str, str]:
    """The environment `make airflow-ui` (`python -m slicewise_dev.airflow_env standalone`)
    starts `airflow standalone` with, from a shell's `environ`: its own `main`, with the
    database migration and Airflow itself left out."""
    as_process_environment(monkeypatch, environ)
    started: dict[str, str] = {}
    monkeypatch.setattr(airflow_env, "migrate", lambda env: None)
    monkeypatch.setattr(airflow_env, "standalone", lambda env: started.update(env) or 0)
    assert airflow_env.main(["standalone"]) == 0
    return started


def test_each_pipelines_tasks_read_their_own_topic_under_make_airflow_ui(tmp_path, monkeypatch):
    defined = load_pipelines(TWO)
    assert {p.topic for p in defined.values()} == {"events", "orders"}
    environ = shell(tmp_path, SLICEWISE_PIPELINES_FILE=str(TWO))
    env = make_airflow_ui(monkeypatch, environ)

    # What each DAG's tasks load, in the environment Airflow gives them.
    as_process_environment(monkeypatch, env)
    for name, pipeline in defined.items():
        settings = task_settings(name)
        assert (settings.pipeline.name, settings.topic) == (name, pipeline.topic)
        assert settings.table("silver").endswith(f"/{name}/silver")
    assert "SLICEWISE_TOPIC" not in env
    # `ui_env` is that environment (tests/integration/test_two_pipelines.py runs Airflow in it).
    assert airflow_env.ui_env(environ) == env


def test_a_one_pipeline_file_keeps_the_topic_it_was_given(tmp_path, monkeypatch):
    """The demo's and the tests' case: SLICEWISE_TOPIC (a test's own topic) reaches the tasks."""
    env = make_airflow_ui(monkeypatch, shell(tmp_path, SLICEWISE_TOPIC="test-topic"))
    assert env["SLICEWISE_TOPIC"] == "test-topic"
    assert load_settings(env).topic == "test-topic"
    # Without it, the tasks read the definition's topic, as the shell would have.
    env = make_airflow_ui(monkeypatch, shell(tmp_path))
    assert load_settings(env).topic == "events"


def test_a_topic_that_would_hold_for_every_pipeline_fails_before_airflow_starts(tmp_path):
    import dataclasses

    environ = shell(tmp_path, SLICEWISE_PIPELINES_FILE=str(TWO))
    settings = dataclasses.replace(load_settings(environ), topic="elsewhere")
    with pytest.raises(ConfigError, match="set each pipeline's `topic:`"):
        airflow_env.airflow_env(settings, environ=environ)
