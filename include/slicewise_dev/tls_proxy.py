"""TLS in front of the Spark Connect server, as docs/DEPLOYING.md shows it: nginx.

Spark Connect 4.1 has no TLS setting of its own, so a server reachable beyond loopback
sits behind a proxy that terminates TLS and passes gRPC on (`grpc_pass`). Here: nginx
from Debian's package, unpacked once into the cache folder (no service, no root
needed), with a self-signed certificate made for the test by `openssl`.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from slicewise.connect_server import port_open
from slicewise_dev.broker import free_ports
from slicewise_dev.process import Child, wait_until


def nginx_binary(cache_dir: Path) -> Path:
    """Debian's nginx, downloaded with apt and unpacked under `cache_dir` once."""
    home = cache_dir / "nginx"
    binary = home / "usr" / "sbin" / "nginx"
    if binary.is_file():
        return binary
    scratch = Path(tempfile.mkdtemp(prefix="nginx-", dir=cache_dir))
    try:
        download = ["apt-get", "download", "-q", "nginx"]
        if subprocess.run(download, cwd=scratch, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], check=True)  # no package lists yet
            subprocess.run(download, cwd=scratch, check=True, capture_output=True)
        (deb,) = scratch.glob("nginx_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(scratch / "root")], check=True)
        (scratch / "root").rename(home)  # whole, or not at all
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return binary


def self_signed(folder: Path, host: str = "localhost") -> tuple[Path, Path]:
    """A certificate for `host` (and 127.0.0.1) and its key; the certificate is also
    the client's trust root."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "proxy.crt", folder / "proxy.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", f"/CN={host}", "-addext", f"subjectAltName=DNS:{host},IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


CONF = """\
daemon off;
master_process off;
pid {home}/nginx.pid;
error_log {home}/error.log warn;
events {{}}
http {{
    access_log off;
    client_body_temp_path {home}/tmp/body;
    proxy_temp_path {home}/tmp/proxy;
    fastcgi_temp_path {home}/tmp/fastcgi;
    uwsgi_temp_path {home}/tmp/uwsgi;
    scgi_temp_path {home}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {{
            grpc_pass grpc://127.0.0.1:{upstream};
            client_max_body_size 0;  # plans and artifacts of any size
            grpc_read_timeout 1h;    # a step's result streams back for as long as it runs
            grpc_send_timeout 1h;
        }}
    }}
}}
"""


class TlsProxy:
    """nginx on a free loopback port, TLS outside, plain gRPC to `upstream` inside."""

    def __init__(self, home: Path, cache_dir: Path, upstream: int) -> None:
        self.home = home
        self.cache_dir = cache_dir
        self.upstream = upstream
        (self.port,) = free_ports(1)
        self._child: Child | None = None

    @property
    def url(self) -> str:
        return f"sc://localhost:{self.port}/;use_ssl=true"

    def __enter__(self) -> TlsProxy:
        binary = nginx_binary(self.cache_dir)
        (self.home / "tmp").mkdir(parents=True, exist_ok=True)
        self.cert, key = self_signed(self.home)
        conf = self.home / "nginx.conf"
        conf.write_text(
            CONF.format(
                home=self.home, port=self.port, cert=self.cert, key=key, upstream=self.upstream
            )
        )
        log = self.home / "error.log"  # nginx's own error log, and its output
        self._child = Child(
            [str(binary), "-p", str(self.home), "-c", str(conf), "-e", str(log)], log
        )
        wait_until(lambda: port_open(self.port), [self._child], "nginx", 30, interval=0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._child is not None:
            self._child.stop(timeout=10)
            self._child = None
