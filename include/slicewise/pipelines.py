"""Pipeline definitions: the user's topics, keys, schemas and event times, from one file.

A definition file (`pipelines.yaml` at the repository root by default, or the file
named by SLICEWISE_PIPELINES_FILE) declares one pipeline per topic: its dedup key,
event-time field, fields and their types, dedup horizon, survivor rule, extra gate
expectations and gold aggregation. Each becomes one Airflow DAG, with its own
tables, offset ledger, Asset and Data Docs (docs/PIPELINES.md).

Loading is pure and cheap (YAML + pydantic, no Spark): DAG files call it while they
are parsed. A mistake fails with a `PipelineDefinitionError` naming the file, the
line and the key, and what is expected there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from slicewise.errors import ConfigError
from slicewise.home import default_pipelines_file

FieldType = Literal[
    "string", "integer", "number", "boolean", "timestamp", "date", "object", "array"
]
# Types a dedup key or a survivor's ordering field may have: scalars that compare.
SCALAR_TYPES = ("string", "integer", "number", "boolean", "timestamp", "date")
ORDERABLE_TYPES = ("integer", "number", "timestamp", "date", "string")
# Event-time formats besides a Spark datetime pattern: numbers since the epoch.
EPOCH_FORMATS = ("epoch_seconds", "epoch_millis")
# Columns every silver table has besides the declared fields.
SYSTEM_COLUMNS = (
    "event_date",
    "kafka_partition",
    "kafka_offset",
    "kafka_timestamp",
    "slice_id",
    "copies",
    "reason",
)
NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SEGMENT = re.compile(r"^[^.'\[\]\s]+$")
EVERY = re.compile(r"^(\d+)\s*(m|min|h|d)$")
SPAN = re.compile(r"^(\d+)\s*(s|m|min|h|d)$")
SPAN_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def as_span(text: str, what: str) -> timedelta:
    """A duration such as `90s`, `30m`, `6h` or `7d`. Raises ValueError naming `what`."""
    match = SPAN.match(str(text).strip())
    if not match:
        raise ValueError(f"{what} {text!r}: write a duration such as 90s, 30m, 6h or 7d")
    return timedelta(seconds=int(match[1]) * SPAN_UNITS[match[2]])


def as_cron(schedule: str) -> str:
    """A schedule as the cron of its data intervals: a cron expression (or preset such as
    `@daily`) as given, or a duration (`5m`, `15min`, `2h`, `1d`) that divides the hour
    or the day, as the cron that cuts intervals on its multiples (`5m`: `*/5 * * * *`),
    so every slice starts at a round time. Raises ValueError saying what is accepted."""
    text = schedule.strip()
    if match := EVERY.match(text):
        n, unit = int(match[1]), match[2]
        if unit in ("m", "min") and n in (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30):
            return f"*/{n} * * * *" if n > 1 else "* * * * *"
        if (unit == "m" or unit == "min") and n == 60 or unit == "h" and n == 1:
            return "0 * * * *"
        if unit == "h" and n in (2, 3, 4, 6, 8, 12):
            return f"0 */{n} * * *"
        if unit == "d" and n == 1 or unit == "h" and n == 24:
            return "0 0 * * *"
        raise ValueError(
            f"schedule {schedule!r}: a duration must divide the hour (1-30 min) or the day "
            "(1-12 h, 24 h, 1d); write any other schedule as cron"
        )
    try:
        from croniter import croniter  # Airflow's own cron parser

        croniter(text)
    except ImportError:
        pass
    except Exception as exc:
        raise ValueError(
            f"schedule {schedule!r}: not a cron expression ({exc}); e.g. '*/5 * * * *', "
            "'0 * * * *', '@daily', or a duration such as 5m or 1h"
        ) from None
    return text


class PipelineDefinitionError(ConfigError):
    """A definition file that cannot be used; the message names file, line and key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldSpec(_Strict):
    """One field of the event: a JSON path (dots for nesting) and what it must hold."""

    type: FieldType
    required: bool = False
    allowed: tuple[str | int | float | bool, ...] | None = Field(default=None, min_length=1)
    allow_blank: bool = False  # strings: may a present value be empty or whitespace?
    # timestamp/date: a Spark datetime pattern, or epoch_seconds / epoch_millis (numbers).
    format: str | None = None
    column: str | None = None  # silver's column; default: the path with '_' for '.'

    @model_validator(mode="after")
    def _consistent(self) -> FieldSpec:
        if self.format is not None and self.type not in ("timestamp", "date"):
            raise ValueError(f"format applies to timestamp and date fields, not {self.type}")
        if self.allowed is not None and self.type not in ("string", "integer", "number", "boolean"):
            raise ValueError(f"allowed values apply to scalar fields, not {self.type}")
        if self.allowed is not None:
            kinds = {
                "string": (str,),
                "integer": (int,),
                "number": (int, float),
                "boolean": (bool,),
            }
            wanted = kinds[self.type]
            for value in self.allowed:
                if not isinstance(value, wanted) or (
                    self.type != "boolean" and isinstance(value, bool)
                ):
                    raise ValueError(f"allowed value {value!r} is not a {self.type}")
        if self.allow_blank and self.type != "string":
            raise ValueError("allow_blank applies to string fields only")
        if self.column is not None and not COLUMN.match(self.column):
            raise ValueError(
                f"column {self.column!r} is not a plain column name (letters, digits, _)"
            )
        return self


class Survivor(_Strict):
    """Which copy of a key silver keeps: by default the lowest Kafka position; with
    `order_by`, the copy with the highest (or lowest) value of that field, ties
    broken by the lowest Kafka position. Either way the choice depends on the copies
    only, never on the order slices run in."""

    order_by: str
    keep: Literal["highest", "lowest"] = "highest"


class Gold(_Strict):
    """Gold: events per UTC hour of the event time and these fields."""

    group_by: tuple[str, ...] = ()


class Maintenance(_Strict):
    """The pipeline's table maintenance (slicewise.maintenance, docs/OPERATIONS.md)."""

    # When it runs: cron or a duration, as `schedule:`.
    schedule: str = "@daily"
    # VACUUM deletes files removed longer ago than this: the reach of time travel, and
    # never shorter than a step may run (SLICEWISE_STEP_TIMEOUT), checked when it runs.
    vacuum_retain: timedelta = timedelta(days=7)
    # Bronze keeps the rows of published slices this long; None keeps everything.
    bronze_retain: timedelta | None = None

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, schedule: str) -> str:
        return as_cron(schedule)

    @field_validator("vacuum_retain", "bronze_retain", mode="before")
    @classmethod
    def _span(cls, value: Any, info: Any) -> timedelta | None:
        if value is None or isinstance(value, timedelta):
            return value
        return as_span(value, info.field_name)


class AirflowConventions(_Strict):
    """How the pipeline's DAGs sit in the Airflow they run in; today's values by default."""

    owner: str = "data-platform"
    retries: int = Field(default=3, ge=0)  # the gate retries once at most: its verdict is data
    max_active_runs: int = Field(default=4, ge=1)
    # The Spark steps take a slot of this pool, so many pipelines (and backfills) cannot
    # overrun one Spark Connect server; create it (`airflow pools set`) before naming it.
    pool: str = Field(default="default_pool", min_length=1)
    spark_connect_conn_id: str = Field(default="spark_connect_default", min_length=1)
    spark_conn_id: str = Field(default="spark_default", min_length=1)  # spark-submit mode


class RegistrySubject(_Strict):
    """Where an Avro pipeline's schemas are: a subject of the schema registry at
    SLICEWISE_SCHEMA_REGISTRY_URL. Records may be written with any of its versions;
    they are read with `version` (the latest by default), by Avro's resolution rules."""

    subject: str | None = Field(default=None, min_length=1)  # default: <topic>-value
    version: int | Literal["latest"] = "latest"


class Pipeline(_Strict):
    """One declared pipeline (its name is its key in the file)."""

    name: str = ""
    description: str = ""
    topic: str = Field(min_length=1)
    tables: str | None = None  # folder of its tables and ledger under the lakehouse
    key: tuple[str, ...] = Field(min_length=1)
    event_time: str
    fields: dict[str, FieldSpec] = Field(min_length=1)
    # Days either side of a slice's own event dates its MERGE, gate and gold read whole.
    # 0: only its own dates, plus the far dates where the key index finds other copies
    # of its keys; what it reads then follows the slice, not a week of silver.
    horizon_days: int = Field(default=0, ge=0)
    # How far (days) an event time may lie from its record's Kafka timestamp, either way,
    # before it is quarantined as out_of_bounds: an event at epoch 0 is a producer's
    # clock gone wrong, not history. The default, ten years, admits a backfill of old
    # events.
    event_time_bound_days: int = Field(default=3653, ge=1)
    survivor: Survivor | None = None
    expectations: tuple[dict[str, dict[str, Any]], ...] = ()
    gold: Gold | None = None
    # Cron or a duration (`as_cron`); None: SLICEWISE_SCHEDULE, else hourly.
    schedule: str | None = None
    # The first interval's start, with its zone. Declared, Airflow runs every interval
    # from it on (catchup), so after a scheduler outage or a paused DAG it also runs the
    # ones it missed. Unset, Airflow runs the latest interval only, and a publication
    # past one it skipped is refused until on-call runs it (`slicewise.coverage`).
    start: datetime | None = None
    maintenance: Maintenance = Maintenance()
    airflow: AirflowConventions = AirflowConventions()
    # The Kafka consumer group a publication moves (slicewise.acknowledge): true for
    # slicewise.<name>, a group id, or false to leave every group alone.
    consumer_group: bool | str = True
    # Silver's deletion vectors (cheap replacing MERGEs); false for readers without them.
    deletion_vectors: bool = True
    # A compacted topic (cleanup.policy=compact) is read only when the definition says
    # what its tombstones are: `quarantine` keeps each as a `null_value` record. Unset,
    # planning refuses such a topic (`planner.CompactedTopic`).
    tombstones: Literal["quarantine"] | None = None
    # What a record's value holds: JSON text, or Avro in the Confluent wire format.
    format: Literal["json", "avro"] = "json"
    schema_registry: RegistrySubject | None = None  # avro: the subject (and reader version)

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, schedule: str | None) -> str | None:
        return None if schedule is None else as_cron(schedule)

    @field_validator("start")
    @classmethod
    def _start(cls, start: datetime | None) -> datetime | None:
        if start is not None and start.tzinfo is None:
            raise ValueError(
                f"start: {start.isoformat()} has no zone; write it as e.g. 2026-12-01T00:00:00Z"
            )
        return start

    @field_validator("consumer_group")
    @classmethod
    def _group(cls, group: bool | str) -> bool | str:
        if isinstance(group, str) and not re.match(r"^[A-Za-z0-9._-]+$", group):
            raise ValueError(
                f"consumer_group: {group!r} is not a group id (letters, digits, '.', '_', '-'); "
                "or true for slicewise.<pipeline>, false for none"
            )
        return group

    @field_validator("fields")
    @classmethod
    def _paths(cls, fields: dict[str, FieldSpec]) -> dict[str, FieldSpec]:
        for path in fields:
            if not all(SEGMENT.match(s) for s in path.split(".")):
                raise ValueError(
                    f"field path {path!r}: use names joined by dots for nesting (a.b.c), "
                    "without quotes, brackets or spaces"
                )
        return fields

    @field_validator("expectations")
    @classmethod
    def _expectations(
        cls, expectations: tuple[dict[str, dict[str, Any]], ...]
    ) -> tuple[dict[str, dict[str, Any]], ...]:
        for i, item in enumerate(expectations):
            if len(item) != 1:
                raise ValueError(
                    f"expectations[{i}]: one Great Expectations name per item, with its "
                    "arguments, e.g. - expect_column_values_to_be_in_set: {column: x, value_set: [a]}"
                )
            (name,) = item
            if not re.match(r"^expect_[a-z0-9_]+$", name):
                raise ValueError(
                    f"expectations[{i}]: {name!r} is not a Great Expectations name "
                    "(expect_..., snake case)"
                )
        return expectations

    @model_validator(mode="after")
    def _references(self) -> Pipeline:
        declared = self.fields
        for i, path in enumerate(self.key):
            spec = declared.get(path)
            if spec is None:
                raise ValueError(
                    f"key[{i}]: {path!r} is not a declared field; declare it under fields"
                )
            if not spec.required or spec.type not in SCALAR_TYPES:
                raise ValueError(
                    f"key[{i}]: {path!r} must be a required field of a scalar type "
                    f"({', '.join(SCALAR_TYPES)})"
                )
        if len(set(self.key)) != len(self.key):
            raise ValueError("key: a field is listed twice")
        spec = declared.get(self.event_time)
        if spec is None or spec.type not in ("timestamp", "date") or not spec.required:
            raise ValueError(
                f"event_time: {self.event_time!r} must be a declared, required field of type "
                "timestamp (or date)"
            )
        if self.survivor is not None:
            spec = declared.get(self.survivor.order_by)
            if spec is None or not spec.required or spec.type not in ORDERABLE_TYPES:
                raise ValueError(
                    f"survivor.order_by: {self.survivor.order_by!r} must be a declared, "
                    f"required field of an ordered type ({', '.join(ORDERABLE_TYPES)})"
                )
        if self.gold is not None:
            for i, path in enumerate(self.gold.group_by):
                if path not in declared:
                    raise ValueError(f"gold.group_by[{i}]: {path!r} is not a declared field")
        columns = [self.column_of(path) for path in declared]
        for column in columns:
            if column in SYSTEM_COLUMNS:
                raise ValueError(
                    f"fields: column {column!r} is one silver adds itself; set `column:` to "
                    "another name"
                )
            if columns.count(column) > 1:
                raise ValueError(
                    f"fields: two fields map to column {column!r}; set `column:` on one"
                )
        if self.schema_registry is not None and self.format != "avro":
            raise ValueError("schema_registry: applies to format: avro")
        if self.tables is not None and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$", self.tables):
            raise ValueError(f"tables: {self.tables!r} is not a relative folder name")
        return self

    def column_of(self, path: str) -> str:
        """Silver's column for a declared field."""
        return self.fields[path].column or path.replace(".", "_")

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(self.column_of(p) for p in self.key)

    @property
    def tables_folder(self) -> str:
        return self.name if self.tables is None else self.tables

    @property
    def dag_id(self) -> str:
        return f"slicewise_{self.name}"

    @property
    def consumer_group_name(self) -> str | None:
        """The group a publication moves, or None when the definition turned it off."""
        if self.consumer_group is True:
            return f"slicewise.{self.name}"
        return self.consumer_group or None

    @property
    def reader_version(self) -> int | str:
        return self.schema_registry.version if self.schema_registry else "latest"

    @property
    def maintenance_dag_id(self) -> str:
        return f"slicewise_{self.name}_maintenance"


class PipelinesFile(_Strict):
    pipelines: dict[str, Pipeline] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        # Each pipeline knows its own name (its key in the file).
        if isinstance(data, dict) and isinstance(data.get("pipelines"), dict):
            data = dict(data)
            data["pipelines"] = {
                name: {**spec, "name": name} if isinstance(spec, dict) else spec
                for name, spec in data["pipelines"].items()
            }
        return data

    @field_validator("pipelines")
    @classmethod
    def _names(cls, pipelines: dict[str, Pipeline]) -> dict[str, Pipeline]:
        for name in pipelines:
            if not NAME.match(name):
                raise ValueError(
                    f"pipeline name {name!r}: use lower-case letters, digits and _ "
                    "(it becomes the DAG id slicewise_<name>)"
                )
        folders = [p.tables_folder for p in pipelines.values()]
        for folder in folders:
            if folders.count(folder) > 1:
                raise ValueError(f"two pipelines keep their tables in {folder!r}; set `tables:`")
        return pipelines


def definitions_file(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get("SLICEWISE_PIPELINES_FILE", "").strip()
    return Path(raw).expanduser() if raw else default_pipelines_file(env)


def load_pipelines(path: Path | str | None = None) -> dict[str, Pipeline]:
    """The pipelines a definition file declares, by name, in the file's order."""
    path = Path(path) if path is not None else definitions_file()
    return _load(path.resolve(), path.stat().st_mtime_ns if path.exists() else 0)


@lru_cache(maxsize=8)
def _load(path: Path, _mtime: int) -> dict[str, Pipeline]:
    if not path.exists():
        raise PipelineDefinitionError(
            f"{path}: no pipeline definition file here; create it (see docs/PIPELINES.md) or "
            "set SLICEWISE_PIPELINES_FILE to yours."
        )
    text = path.read_text()
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise PipelineDefinitionError(f"{where}: not valid YAML: {exc}") from None
    try:
        return dict(PipelinesFile.model_validate(data or {}).pipelines)
    except ValidationError as exc:
        raise PipelineDefinitionError(_describe(path, node, exc)) from None


def _describe(path: Path, root: yaml.Node | None, exc: ValidationError) -> str:
    lines = [f"{path}: {exc.error_count()} problem(s) in the pipeline definitions:"]
    for error in exc.errors():
        loc = [p for p in error["loc"] if not str(p).startswith(("function-", "tagged-union"))]
        key = ".".join(str(p) for p in loc) or "(top level)"
        line = _line_of(root, loc)
        # In the user's words: a YAML list, not a Python tuple.
        message = (
            error["msg"]
            .removeprefix("Value error, ")
            .replace("Tuple should", "List should")
            .replace(" after validation", "")
        )
        if error["type"] == "extra_forbidden":
            message = "unknown key (a typo?)"
        elif error["type"] == "missing":
            message = "required key is missing"
        lines.append(f"  {path.name}:{line} {key}: {message}")
    return "\n".join(lines)


def _line_of(node: yaml.Node | None, loc: list[Any]) -> int:
    """The 1-based line of the YAML node at `loc` (or of its deepest existing parent)."""
    line = 1 if node is None else node.start_mark.line + 1
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    child = value
                    line = key.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part < len(node.value):
                child = node.value[part]
                line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


def pipeline_named(name: str | None, path: Path | str | None = None) -> Pipeline:
    """The named pipeline, or the file's first one when no name is given."""
    pipelines = load_pipelines(path)
    if not name:
        return next(iter(pipelines.values()))
    if name not in pipelines:
        raise PipelineDefinitionError(
            f"pipeline {name!r} is not defined in {path or definitions_file()} (defined: "
            f"{', '.join(pipelines)}); set SLICEWISE_PIPELINE or --pipeline to one of them."
        )
    return pipelines[name]
