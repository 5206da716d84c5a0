"""A local S3-compatible server for the tests: s3proxy from Maven Central.

Its `filesystem-nio2` backend keeps objects as files under the state folder and
checks `If-None-Match: *` atomically, which the ledger's first-writer-wins
create needs (moto's server checks it without a lock). A bucket is a folder of
that backend, so creating one is a mkdir.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from slicewise.connect_server import port_open
from slicewise_dev.broker import free_ports
from slicewise_dev.process import Child, wait_until

S3PROXY_VERSION = "4.1.0"
ARTIFACT = f"org.gaul:s3proxy:{S3PROXY_VERSION}:jar:jar-with-dependencies"


@contextlib.contextmanager
def fetched_artifact(artifact: str, parent: Path, what: str) -> Iterator[Path]:
    """One artifact from Maven Central, in a scratch folder under `parent` that is
    deleted afterwards: the caller moves what it keeps into place whole, or not at all."""
    if shutil.which("mvn") is None:
        raise RuntimeError(f"Maven (`mvn`) is needed once to fetch {what}; apt-get install maven")
    parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{what}-", dir=parent))
    try:
        subprocess.run(
            ["mvn", "-q", "-B", "dependency:copy", f"-Dartifact={artifact}",
             f"-DoutputDirectory={scratch}"],
            check=True,
        )  # fmt: skip
        (fetched,) = [p for p in scratch.iterdir() if p.is_file()]
        yield fetched
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def s3proxy_jar(cache_dir: Path) -> Path:
    """The server's jar, copied out of Maven Central once."""
    jar = cache_dir / f"s3proxy-{S3PROXY_VERSION}" / "s3proxy.jar"
    if not jar.is_file():
        with fetched_artifact(ARTIFACT, jar.parent, "s3proxy") as fetched:
            fetched.rename(jar)
    return jar


class LocalS3:
    """s3proxy on a free port of loopback (or `host`, for clients on other hosts),
    objects under `state_dir`; a context manager."""

    access_key = "slicewise-test"
    secret_key = "slicewise-test-secret"
    region = "us-east-1"

    def __init__(self, state_dir: Path, cache_dir: Path, host: str = "127.0.0.1") -> None:
        self.state_dir = state_dir
        self.cache_dir = cache_dir
        (self.port,) = free_ports(1)
        self.host = host
        self.endpoint = f"http://{host}:{self.port}"
        self._child: Child | None = None

    def __enter__(self) -> LocalS3:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def env(self) -> dict[str, str]:
        """What a client needs, in the variables AWS SDKs, obstore and our Spark conf read."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    def create_bucket(self, name: str) -> str:
        (self.state_dir / "objects" / name).mkdir(parents=True, exist_ok=True)
        return name

    def start(self, timeout: float = 60) -> None:
        jar = s3proxy_jar(self.cache_dir)
        objects = self.state_dir / "objects"
        objects.mkdir(parents=True, exist_ok=True)
        conf = self.state_dir / "s3proxy.conf"
        conf.write_text(
            f"s3proxy.endpoint={self.endpoint}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={self.access_key}\n"
            f"s3proxy.credential={self.secret_key}\n"
            "jclouds.provider=filesystem-nio2\n"
            f"jclouds.filesystem.basedir={objects}\n"
        )
        self._child = Child(
            ["java", "-jar", str(jar), "--properties", str(conf)], self.state_dir / "s3proxy.log"
        )
        wait_until(lambda: port_open(self.port, self.host), [self._child], "s3proxy", timeout)

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()
        self._child = None
