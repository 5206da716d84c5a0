"""Who may run code on the engine: the Spark Connect server's pre-shared token.

The server runs whatever plan a client sends, with the lakehouse's credentials, so it
starts with `spark.connect.authenticate.token` (Spark 4.1's pre-shared-key
interceptor) and refuses every request without `authorization: Bearer <token>`.

Where a client's token comes from, first found wins:

1. the connection URL's own `;token=` (what the Airflow `spark_connect` connection's
   password becomes, through the provider's hook);
2. SLICEWISE_SPARK_TOKEN (a deployment's secret);
3. the token file our server generated in the state folder,
   `<state>/spark-connect/token`, readable by its owner only.

On the wire: pyspark sends `;token=` as gRPC call credentials, which gRPC sends over
TLS only. Over plain loopback the client sends the same header as a connection-string
parameter instead; with `;use_ssl=true` (TLS in front of the server, docs/DEPLOYING.md)
the token stays a call credential. The token is never logged: every URL shown to a
person goes through `redacted`.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

TOKEN_ENV = "SLICEWISE_SPARK_TOKEN"
TOKEN_PARAM = "token"
HEADER_PARAM = "authorization"
HIDDEN = "***"


def token_file(state_dir: Path) -> Path:
    return Path(state_dir) / "spark-connect" / "token"


def configured_token(env: Mapping[str, str], state_dir: Path) -> str | None:
    """The token this deployment's clients send, if it has one."""
    given = env.get(TOKEN_ENV, "").strip()
    if given:
        return given
    path = token_file(state_dir)
    return path.read_text().strip() if path.exists() else None


def server_token(env: Mapping[str, str], state_dir: Path) -> str:
    """The token our server starts with: the configured one, else one generated once
    for the state folder (mode 0600), which the clients of that folder then read."""
    token = configured_token(env, state_dir)
    if token:
        return token
    path = token_file(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process generated it first: use that one
        return path.read_text().strip()
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def _split(url: str) -> tuple[str, dict[str, str]]:
    base, *pairs = url.split(";")
    params = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    return base, params


def _join(base: str, params: Mapping[str, str]) -> str:
    if not params:
        return base
    base = base if base.endswith("/") else f"{base}/"
    return base + "".join(f";{key}={value}" for key, value in params.items())


def uses_tls(url: str) -> bool:
    return _split(url)[1].get("use_ssl", "").lower() == "true"


def authorized_url(url: str, token: str | None) -> str:
    """`url` as pyspark's client must see it to send the token: the URL's own `;token=`
    wins over `token`; no token at all leaves the URL as it is (the server refuses)."""
    base, params = _split(url)
    token = params.pop(TOKEN_PARAM, None) or (quote(token, safe="") if token else None)
    if token is None:
        return url
    if uses_tls(url):
        params[TOKEN_PARAM] = token
    else:
        params[HEADER_PARAM] = quote("Bearer ", safe="") + token
    return _join(base, params)


def redacted(url: str) -> str:
    """`url` with its token (either form) hidden: the only form a log or error shows."""
    base, params = _split(url)
    for key in (TOKEN_PARAM, HEADER_PARAM):
        if key in params:
            params[key] = HIDDEN
    return _join(base, params)
