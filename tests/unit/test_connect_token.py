"""The Spark Connect token on the client side: where it comes from, how it travels, and
that nothing shown to a person carries it (the server's refusals: test_connect_refusals in
tests/integration)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat

from slicewise.cli import step_engine
from slicewise.config import load_settings
from slicewise.connect_auth import (
    TOKEN_ENV,
    authorized_url,
    configured_token,
    redacted,
    server_token,
    token_file,
)
from slicewise.connect_server import DEFAULT_PORT, connect_connection


def test_plain_loopback_sends_the_token_as_the_header_the_server_checks():
    assert authorized_url("sc://127.0.0.1:15002", "s3cr=t") == (
        "sc://127.0.0.1:15002/;authorization=Bearer%20s3cr%3Dt"
    )


def test_tls_keeps_the_token_a_call_credential():
    url = "sc://spark.example.com:443/;use_ssl=true"
    assert authorized_url(url, "t0k") == f"{url};token=t0k"


def test_the_urls_own_token_wins_and_no_token_leaves_the_url_alone():
    # What the Airflow provider's hook builds from a connection's password.
    hook_url = "sc://127.0.0.1:15002/;user_id=airflow;token=from-conn"
    assert authorized_url(hook_url, "from-env") == (
        "sc://127.0.0.1:15002/;user_id=airflow;authorization=Bearer%20from-conn"
    )
    assert authorized_url("sc://127.0.0.1:15002", None) == "sc://127.0.0.1:15002"


def test_redacted_hides_either_form():
    for url in (
        authorized_url("sc://h:1", "s3cret"),
        authorized_url("sc://h:1/;use_ssl=true", "s3cret"),
    ):
        shown = redacted(url)
        assert "s3cret" not in shown and "***" in shown


def test_the_server_generates_one_token_per_state_folder_readable_by_its_owner_only(tmp_path):
    first = server_token({}, tmp_path)
    assert server_token({}, tmp_path) == first == configured_token({}, tmp_path)
    assert stat.S_IMODE(token_file(tmp_path).stat().st_mode) == 0o600
    assert server_token({}, tmp_path / "other") != first
    # A deployment's own token wins and writes nothing.
    assert server_token({TOKEN_ENV: "given"}, tmp_path / "third") == "given"
    assert not token_file(tmp_path / "third").exists()


def test_settings_carry_the_token_but_never_show_it(tmp_path):
    settings = load_settings({"SLICEWISE_STATE_DIR": str(tmp_path), TOKEN_ENV: "s3cret"})
    assert settings.spark_token == "s3cret" and "s3cret" not in repr(settings)


def test_the_airflow_connection_holds_the_token_as_its_password():
    connection = json.loads(connect_connection("sc://127.0.0.1:15002", "t0k"))
    assert connection == {
        "conn_type": "spark_connect",
        "host": "127.0.0.1",
        "port": 15002,
        "password": "t0k",
    }
    tls = json.loads(connect_connection("sc://proxy:8443/;use_ssl=true", "t0k"))
    assert tls["extra"] == {"use_ssl": True} and tls["host"] == "proxy"


def test_a_step_run_by_hand_uses_the_configured_then_the_local_server_and_says_so(
    tmp_path, monkeypatch
):
    """`slicewise ingest ...` without --master: the configured server, else the local one
    while it runs (its own token), else a driver of its own; the words name which."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    env = {"SLICEWISE_STATE_DIR": str(tmp_path), "SLICEWISE_TOPIC": "t"}
    monkeypatch.setenv("SLICEWISE_STATE_DIR", str(tmp_path))
    settings = load_settings(env)

    same, where = step_engine(settings, "local[2]")
    assert same is settings and "own driver on local[2] (--master)" in where
    same, where = step_engine(settings, None)  # nothing runs under this state folder
    assert same.spark_remote is None and "own driver on local[*]" in where
    assert "python -m slicewise.connect_server start" in where

    # The local server runs: its pid file names a live process, its port answers.
    home = tmp_path / "spark-connect"
    home.mkdir(exist_ok=True)
    (home / "server.pid").write_text(str(os.getpid()))
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # a real local server may hold the port: as good
            listener.bind(("127.0.0.1", DEFAULT_PORT))
            listener.listen()
        local, where = step_engine(settings, None)
    assert local.spark_remote == f"sc://127.0.0.1:{DEFAULT_PORT}"
    assert local.spark_token == server_token({}, tmp_path)  # the server's own, from the folder
    assert f"local Spark Connect server sc://127.0.0.1:{DEFAULT_PORT}" in where
    assert local.spark_token not in where

    remote = load_settings({**env, "SLICEWISE_SPARK_REMOTE": "sc://spark.example.com:15002"})
    same, where = step_engine(remote, None)
    assert same is remote and "sc://spark.example.com:15002 (SLICEWISE_SPARK_REMOTE)" in where
