"""Pipeline definitions: validation errors (file, line, key, and what is expected).
The property-based tests over generated definitions are in tests/spark/."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from slicewise.pipelines import (
    PipelineDefinitionError,
    PipelinesFile,
    load_pipelines,
)

REPO = Path(__file__).resolve().parents[2]
TS = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)


def test_the_shipped_definitions_load():
    assert list(load_pipelines(REPO / "pipelines.yaml")) == ["events"]
    both = load_pipelines(REPO / "docs" / "examples" / "two-pipelines.yaml")
    assert both["orders"].key_columns == ("tenant", "order_id")
    assert both["orders"].dag_id == "slicewise_orders"


BAD = [
    # (yaml, expected fragments of the message)
    ("pipelines: {}", ["pipelines.yaml:1 pipelines: Dictionary should have at least 1 item"]),
    (
        """pipelines:
  orders:
    topic: orders
    key: [tenant]
    event_time: created_at
    fields:
      tenant: {type: strin, required: true}
      created_at: {type: timestamp, required: true}
    horizon: 3
""",
        [
            "2 problem(s)",
            "pipelines.yaml:7 pipelines.orders.fields.tenant.type: Input should be 'string'",
            "pipelines.yaml:9 pipelines.orders.horizon: unknown key (a typo?)",
        ],
    ),
    (
        """pipelines:
  orders:
    topic: orders
    key: [tenant, order.id]
    event_time: created_at
    fields:
      tenant: {type: string, required: true}
      created_at: {type: timestamp, required: true}
""",
        ["pipelines.yaml:2 pipelines.orders: key[1]: 'order.id' is not a declared field"],
    ),
    (
        """pipelines:
  Orders:
    topic: orders
    key: [id]
    event_time: at
    fields:
      id: {type: string}
      at: {type: string, required: true}
""",
        ["pipelines.yaml:2 pipelines.Orders: key[0]: 'id' must be a required field"],
    ),
    (
        """pipelines:
  Orders:
    topic: orders
    key: [id]
    event_time: at
    fields:
      id: {type: string, required: true}
      at: {type: timestamp, required: true}
""",
        ["pipelines.yaml:1 pipelines: pipeline name 'Orders': use lower-case letters"],
    ),
    (
        """pipelines:
  orders:
    topic: orders
    key: [id]
    event_time: at
    fields:
      id: {type: string, required: true}
      at: {type: timestamp, required: true}
      slice_id: {type: string}
""",
        ["pipelines.yaml:2 pipelines.orders: fields: column 'slice_id' is one silver adds itself"],
    ),
    (
        """pipelines:
  orders:
    topic: orders
    key: [id]
    event_time: at
    fields:
      id: {type: string, required: true}
      at: {type: timestamp, required: true}
    expectations:
      - expect_this: {}
        expect_that: {}
""",
        ["pipelines.yaml:9 pipelines.orders.expectations: expectations[0]: one Great"],
    ),
    (
        """pipelines:
  orders:
    topic: orders
    key: [id]
    event_time: at
    fields:
      id: {type: string, required: true}
      at: {type: timestamp, required: true}
    consumer_group: "orders lag"
""",
        ["pipelines.orders.consumer_group", "'orders lag' is not a group id"],
    ),
    (
        """\
pipelines:
  orders:
    topic: t
    key: [id]
    event_time: at
    fields:
      id: {type: string, required: true}
      at: {type: timestamp, required: true}
    schema_registry: {subject: orders-value}
""",
        ["pipelines.orders", "schema_registry: applies to format: avro"],
    ),
    ("pipelines: [a", ["not valid YAML"]),
]


@pytest.mark.parametrize(("text", "fragments"), BAD)
def test_a_bad_definition_names_file_line_key_and_what_is_expected(tmp_path, text, fragments):
    path = tmp_path / "pipelines.yaml"
    path.write_text(text)
    with pytest.raises(PipelineDefinitionError) as caught:
        load_pipelines(path)
    message = str(caught.value)
    assert message.startswith(str(path)), message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    ("setting", "group"),
    [
        ({}, "slicewise.orders"),
        ({"consumer_group": "etl.orders"}, "etl.orders"),
        ({"consumer_group": False}, None),
    ],
)
def test_the_consumer_group_a_publication_moves(setting, group):
    [p] = PipelinesFile.model_validate(
        {
            "pipelines": {
                "orders": {
                    "topic": "t",
                    "key": ["id"],
                    "event_time": "at",
                    "fields": {
                        "id": {"type": "string", "required": True},
                        "at": {"type": "timestamp", "required": True},
                    },
                    **setting,
                }
            }
        }
    ).pipelines.values()
    assert p.consumer_group_name == group


def test_an_unknown_expectation_fails_the_check_naming_pipeline_and_item():
    from slicewise.gate import declared_expectations

    [p] = PipelinesFile.model_validate(
        {
            "pipelines": {
                "p": {
                    "topic": "t",
                    "key": ["id"],
                    "event_time": "at",
                    "fields": {
                        "id": {"type": "string", "required": True},
                        "at": {"type": "timestamp", "required": True},
                    },
                    "expectations": [{"expect_column_to_be_lovely": {"column": "id"}}],
                }
            }
        }
    ).pipelines.values()
    with pytest.raises(PipelineDefinitionError, match=r"pipeline 'p', expectations\[0\]"):
        declared_expectations(p)


def test_an_avro_pipeline_reads_its_subject_from_the_configured_registry(tmp_path):
    from slicewise.config import load_settings
    from slicewise.errors import ConfigError

    path = tmp_path / "pipelines.yaml"
    path.write_text(
        "pipelines:\n  orders:\n    topic: orders\n    format: avro\n    key: [id]\n"
        "    event_time: at\n    fields:\n      id: {type: string, required: true}\n"
        "      at: {type: timestamp, required: true}\n"
    )
    env = {"SLICEWISE_PIPELINES_FILE": str(path), "SLICEWISE_STATE_DIR": str(tmp_path)}
    with pytest.raises(ConfigError, match="set SLICEWISE_SCHEMA_REGISTRY_URL"):
        load_settings(env)
    settings = load_settings(
        {
            **env,
            "SLICEWISE_SCHEMA_REGISTRY_URL": "http://registry:8081",
            "SLICEWISE_SCHEMA_REGISTRY_USER": "etl",
            "SLICEWISE_SCHEMA_REGISTRY_PASSWORD": "registry-secret",
        }
    )
    assert settings.schema_subject == "orders-value"
    assert settings.pipeline.reader_version == "latest"
    assert settings.schema_registry is not None and settings.schema_registry.user == "etl"
    assert "registry-secret" not in repr(settings)
