"""An Avro pipeline's schemas, from a Confluent-compatible schema registry.

The registry's REST API is small and stable (Confluent Schema Registry, and the
`ccompat` API of Apicurio, Karapace and Redpanda), so this speaks it with the
standard library: the subject's versions (its writer schemas) and the version a
pipeline reads with. Schemas are immutable once registered, so a schema read by id
is kept for the process. Credentials come from the settings and never reach a log
or an error message.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from slicewise.errors import OperationalError


class RegistryUnavailable(OperationalError):
    """The schema registry could not answer; nothing was written."""


class SubjectNotFound(OperationalError):
    """The pipeline's subject (or its pinned version) is not in the registry."""


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    version: int
    schema: str  # the schema's JSON text, as registered


@dataclass
class SchemaRegistry:
    url: str  # the API's root, e.g. http://registry:8081 or .../apis/ccompat/v7
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    timeout: float = 10.0

    def _get(self, path: str) -> Any:
        request = urllib.request.Request(
            self.url.rstrip("/") + path,
            headers={"Accept": "application/vnd.schemaregistry.v1+json, application/json"},
        )
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise LookupError(path) from None
            raise RegistryUnavailable(
                f"the schema registry at {self.url} answered {exc.code} {exc.reason} for "
                f"{path}; check SLICEWISE_SCHEMA_REGISTRY_URL and its credentials, then retry "
                "the task: nothing was written."
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise RegistryUnavailable(
                f"the schema registry at {self.url} did not answer ({exc}); retry the task once "
                "it is back: nothing was written."
            ) from None

    def version(self, subject: str, version: int | str = "latest") -> RegisteredSchema:
        """One version of `subject` (a number, or "latest")."""
        quoted = urllib.parse.quote(subject, safe="")
        try:
            found = self._get(f"/subjects/{quoted}/versions/{version}")
        except LookupError:
            raise SubjectNotFound(
                f"the schema registry at {self.url} has no version {version} of subject "
                f"{subject!r}; register the schema the topic's producers use, or fix the "
                "pipeline's schema_registry.subject / version."
            ) from None
        return RegisteredSchema(int(found["id"]), int(found["version"]), found["schema"])

    def versions(self, subject: str) -> list[RegisteredSchema]:
        """Every version of `subject`, oldest first: the writer schemas its records may use."""
        quoted = urllib.parse.quote(subject, safe="")
        try:
            numbers = self._get(f"/subjects/{quoted}/versions")
        except LookupError:
            raise SubjectNotFound(
                f"the schema registry at {self.url} has no subject {subject!r}; register the "
                "schema the topic's producers use, or fix the pipeline's schema_registry.subject."
            ) from None
        return [self.version(subject, n) for n in sorted(numbers)]
