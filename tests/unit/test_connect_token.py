"""The Spark Connect token on the client side: where it comes from, how it travels, and
that nothing shown to a person carries it (the server's refusals: test_connect_refusals in
tests/integration)."""

from __future__ import annotations

import json
import stat

from slicewise.config import load_settings
from slicewise.connect_auth import (
    TOKEN_ENV,
    authorized_url,
    configured_token,
    redacted,
    server_token,
    token_file,
)
from slicewise.connect_server import connect_connection


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
