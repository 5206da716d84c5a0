"""Only the pipeline runs code on its engine: the run's real Spark Connect server refuses
a client without its token or with a wrong one, serves one with it, never writes it to
its log, and serves it through a real TLS proxy (nginx) off loopback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest
from pyspark.sql import SparkSession

from slicewise.config import load_settings
from slicewise.connect_auth import TOKEN_ENV
from slicewise.spark import SparkUnauthorized, close_refused, remote_session
from slicewise_dev.tls_proxy import TlsProxy

pytestmark = pytest.mark.integration


def test_a_client_without_the_token_or_with_a_wrong_one_is_refused(connect_server):
    url = connect_server.url
    bare = SparkSession.builder.remote(url).create()  # pyspark alone, no token
    try:
        with pytest.raises(Exception, match="No authentication token provided"):
            bare.range(1).collect()
    finally:
        close_refused(bare)

    wrong = "not-the-token"
    with pytest.raises(SparkUnauthorized) as refused:
        remote_session(url, "wrong-token", fresh=True, token=wrong)
    message = str(refused.value)
    assert "Invalid authentication token" in message and "Nothing was written" in message
    assert TOKEN_ENV in message and wrong not in message

    served = remote_session(url, "right-token", fresh=True)  # the run's token, from the env
    try:
        assert served.range(3).count() == 3
    finally:
        served.stop()


def test_the_token_is_kept_from_the_command_line_and_the_servers_log(connect_server):
    token = connect_server.token
    secrets = connect_server.home / "secrets.properties"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600 and token in secrets.read_text()
    server_pid = int(connect_server.pid_path.read_text())
    with open(f"/proc/{server_pid}/cmdline", "rb") as cmdline:
        assert token.encode() not in cmdline.read()
    log = connect_server.log_path.read_text(errors="replace").splitlines()
    # The lines themselves (the token cut out), so a leak says which writer made it.
    leaks = [line.replace(token, "<token>")[:2000] for line in log if token in line]
    assert leaks == [], leaks


def test_a_client_reaches_the_server_through_a_tls_proxy_with_the_token(connect_server, tmp_path):
    """What docs/DEPLOYING.md shows for a server off loopback: TLS terminated by nginx in
    front of it, the client with `use_ssl=true` and the token as a call credential. The
    client trusts the test's certificate through gRPC's roots setting, read once per
    process, so it runs in a process of its own."""
    cache_dir = load_settings().cache_dir
    with TlsProxy(tmp_path / "proxy", cache_dir, connect_server.port) as proxy:
        client = textwrap.dedent(
            f"""
            import sys
            from slicewise.spark import SparkUnauthorized, remote_session
            try:
                remote_session({proxy.url!r}, "tls-wrong", fresh=True, token="wrong")
            except SparkUnauthorized as exc:
                print("refused:", exc)
            else:
                sys.exit("a wrong token was served")
            spark = remote_session({proxy.url!r}, "tls", fresh=True)
            print("count:", spark.range(5).count())
            spark.stop()
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", client],
            env={**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(proxy.cert)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused:" in done.stdout and "Invalid authentication token" in done.stdout
    assert "count: 5" in done.stdout
    assert connect_server.token not in done.stdout + done.stderr
