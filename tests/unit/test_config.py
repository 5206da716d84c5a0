import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from slicewise.config import LOCAL_BOOTSTRAP, ConfigError, load_settings, schedule
from slicewise.pipelines import PipelineDefinitionError, as_cron, load_pipelines

T0 = datetime(2026, 11, 22, 3, tzinfo=timezone.utc)


def test_defaults_need_no_configuration(tmp_path):
    s = load_settings({"SLICEWISE_STATE_DIR": str(tmp_path)})
    assert s.bootstrap_servers == LOCAL_BOOTSTRAP
    assert s.lakehouse == str(tmp_path / "lakehouse")
    # The example pipeline of pipelines.yaml, its tables in a folder of their own.
    assert (s.pipeline.name, s.topic) == ("events", "events")
    assert s.table("silver") == f"{tmp_path}/lakehouse/events/silver"
    assert s.dedup_horizon_days == 0


def test_kafka_properties_reach_the_python_clients_as_given():
    s = load_settings(
        {
            "SLICEWISE_KAFKA_PROP_SASL_MECHANISM": "PLAIN",
            "SLICEWISE_KAFKA_PROP_SECURITY_PROTOCOL": "SASL_SSL",
        }
    )
    assert dict(s.kafka_props) == {"sasl.mechanism": "PLAIN", "security.protocol": "SASL_SSL"}


def test_a_printed_or_logged_settings_shows_which_secrets_are_set_never_their_values(tmp_path):
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required password="s3cr3t";'
    s = load_settings(
        {
            "SLICEWISE_STATE_DIR": str(tmp_path),
            "SLICEWISE_KAFKA_PROP_SECURITY_PROTOCOL": "SASL_SSL",
            "SLICEWISE_KAFKA_PROP_SASL_MECHANISM": "PLAIN",
            "SLICEWISE_KAFKA_PROP_SASL_USERNAME": "etl",
            "SLICEWISE_KAFKA_PROP_SASL_PASSWORD": "pa55word",
            "SLICEWISE_KAFKA_SPARK_PROP_SASL_JAAS_CONFIG": jaas,
            "SLICEWISE_SPARK_REMOTE": "sc://spark:15002/;token=t0ken;use_ssl=true",
            "SLICEWISE_SPARK_TOKEN": "env-t0ken",
        }
    )
    assert s.kafka_props["sasl.password"] == "pa55word"  # the values are all still there
    shown = repr(s)
    for text in (shown, str(s), f"{s}"):  # what a log line or a print shows
        for secret in ("pa55word", "s3cr3t", "t0ken"):
            assert secret not in text, text
    # The keys stay, so a reader sees what is configured.
    assert "'sasl.password': '***'" in shown and "'sasl.jaas.config': '***'" in shown
    assert "'security.protocol': '***'" in shown
    assert "spark_remote='sc://spark:15002/;token=***;use_ssl=true'" in shown
    assert shown.startswith("Settings(bootstrap_servers='127.0.0.1:19092', topic='events', ")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SLICEWISE_MAX_VALUE_BYTES": "big"},
            "SLICEWISE_MAX_VALUE_BYTES='big' is not an integer",
        ),
        ({"SLICEWISE_PIPELINE": "orders"}, "pipeline 'orders' is not defined in"),
        ({"SLICEWISE_PIPELINES_FILE": "/nowhere.yaml"}, "no pipeline definition file here"),
        ({"SLICEWISE_GRACE_SECONDS": "-5"}, "SLICEWISE_GRACE_SECONDS=-5 is below 0"),
        ({"SLICEWISE_RECORDS_PER_TASK": "-1"}, "SLICEWISE_RECORDS_PER_TASK=-1 is below 0"),
        ({"SLICEWISE_TOPIC": "  "}, "SLICEWISE_TOPIC is blank"),
        ({"SLICEWISE_KAFKA_BOOTSTRAP": "kafka"}, "has no port"),
        (
            {"SLICEWISE_SPARK_MODE": "submit", "SLICEWISE_LAKEHOUSE": "s3a://b/lh"},
            "safe with one writing driver only",
        ),
    ],
)
def test_bad_configuration_fails_fast_with_what_to_change(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_settings(env)


def test_the_ledger_lives_with_the_tables_unless_placed_elsewhere(tmp_path):
    lh = load_settings({"SLICEWISE_LAKEHOUSE": "/data/lh"})
    assert lh.ledger_dir == "/data/lh/events/_ledger"
    placed = load_settings({"SLICEWISE_LAKEHOUSE": "s3a://b/lh", "SLICEWISE_LEDGER_DIR": "/mnt/l"})
    assert (placed.table("silver"), placed.ledger_dir) == (
        "s3a://b/lh/events/silver",
        "/mnt/l/events",
    )


TWO_ON_ONE_TOPIC = """
pipelines:
  loose:
    topic: events
    key: [event_id]
    event_time: occurred_at
    fields:
      event_id: {type: string, required: true}
      occurred_at: {type: timestamp, required: true}
  strict:
    topic: events
    key: [event_id]
    event_time: occurred_at
    fields:
      event_id: {type: string, required: true}
      occurred_at: {type: timestamp, required: true}
"""


def test_two_pipelines_on_one_topic_never_share_a_ledger_under_slicewise_ledger_dir(tmp_path):
    from slicewise.ledger import Ledger
    from slicewise.slices import Boundary

    (tmp_path / "pipelines.yaml").write_text(TWO_ON_ONE_TOPIC)
    env = {
        "SLICEWISE_PIPELINES_FILE": str(tmp_path / "pipelines.yaml"),
        "SLICEWISE_LEDGER_DIR": str(tmp_path / "ledgers"),
    }
    loose, strict = (load_settings(env, pipeline=p) for p in ("loose", "strict"))
    assert loose.ledger_dir == f"{tmp_path}/ledgers/loose"
    assert strict.ledger_dir == f"{tmp_path}/ledgers/strict"
    # A ledger an earlier version kept per topic, shared by both: every step refuses,
    # naming the pipelines and the move, rather than mixing their records.
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    Ledger(str(tmp_path / "ledgers"), "events").put_boundary(Boundary("events", at, {0: 0}))
    for p in ("loose", "strict"):
        with pytest.raises(ConfigError, match="shared by pipelines loose, strict") as refused:
            Ledger.of(load_settings(env, pipeline=p))
        assert "run each pipeline's gate" in str(refused.value)
    # Moved (copied to each pipeline's folder), each finds its own.
    for p in ("loose", "strict"):
        shutil.copytree(tmp_path / "ledgers" / "events", tmp_path / "ledgers" / p / "events")
        moved = Ledger.of(load_settings(env, pipeline=p))
        assert str(moved.store) == f"{tmp_path}/ledgers/{p}/events"


def test_a_ledger_an_earlier_version_kept_per_topic_is_found_where_it_is(tmp_path):
    from slicewise.ledger import Ledger
    from slicewise.slices import Boundary

    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    Ledger(str(tmp_path), "events").put_boundary(Boundary("events", at, {0: 7}))
    settings = load_settings({"SLICEWISE_LEDGER_DIR": str(tmp_path)})  # one pipeline, `events`
    assert settings.ledger_dir == f"{tmp_path}/events"  # where a new one would go
    assert str(Ledger.of(settings).store) == f"{tmp_path}/events"  # the earlier one
    assert Ledger.of(settings).boundary(at).offsets == {0: 7}


def test_the_ledger_follows_the_tables_onto_an_object_store_and_refuses_other_schemes():
    from slicewise.ledger import Ledger
    from slicewise.store import LocalFolder, ObjectStore

    settings = load_settings({"SLICEWISE_LAKEHOUSE": "s3a://bucket/lakehouse"})
    ledger = Ledger.of(settings)
    assert isinstance(ledger.store, ObjectStore)
    assert str(ledger.store) == "s3a://bucket/lakehouse/events/_ledger/events"
    assert isinstance(Ledger("file:///data/lh/_ledger", "events").store, LocalFolder)
    with pytest.raises(ConfigError, match="set SLICEWISE_LEDGER_DIR"):
        Ledger("hdfs://namenode/lakehouse/_ledger", settings.topic)


def test_spark_finds_the_ledgers_object_store_and_its_credentials_stay_off_the_command_line(
    tmp_path, monkeypatch
):
    from slicewise.connect_server import SparkConnectServer, server_command
    from slicewise.spark import object_store_conf, object_store_secrets

    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalr/K7MDENG+bPxRfiCY=",
    }
    assert object_store_conf(env) == {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "False",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
    }
    assert object_store_conf({}) == {} and object_store_secrets({}) == {}
    secrets = object_store_secrets(env)
    assert secrets["spark.hadoop.fs.s3a.secret.key"] == env["AWS_SECRET_ACCESS_KEY"]

    server = SparkConnectServer(tmp_path / "server")
    server.home.mkdir()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = server._write_secrets()
    assert path is not None and oct(path.stat().st_mode & 0o777) == "0o600"
    assert "wJalr/K7MDENG+bPxRfiCY=" in path.read_text()
    command = " ".join(server_command(15002, "local[*]", secrets=path))
    assert (
        "--properties-file" in command and "wJalr" not in command and "AKIDEXAMPLE" not in command
    )


def test_a_slice_is_read_in_tasks_of_bounded_size_unless_switched_off():
    from slicewise.bronze import kafka_options
    from slicewise.slices import Slice

    sl = Slice("t", T0, T0, {0: (0, 10), 1: (5, 5)})
    ranges = dict(sl.ranges)
    options = kafka_options(load_settings({}), sl, ranges)
    assert options["maxRecordsPerPartition"] == "50000"
    assert options["assign"] == '{"t": [0]}'  # an empty range is not read at all
    off = load_settings({"SLICEWISE_RECORDS_PER_TASK": "0"})
    assert "maxRecordsPerPartition" not in kafka_options(off, sl, ranges)


@pytest.mark.parametrize(
    ("given", "cron"),
    [
        ("5m", "*/5 * * * *"),
        ("15min", "*/15 * * * *"),
        ("1h", "0 * * * *"),
        ("6h", "0 */6 * * *"),
        ("1d", "0 0 * * *"),
        ("*/10 * * * *", "*/10 * * * *"),
        ("@daily", "@daily"),
    ],
)
def test_a_schedule_is_cron_or_a_duration_that_divides_the_hour_or_day(given, cron):
    assert as_cron(given) == cron
    assert schedule({"SLICEWISE_SCHEDULE": given}) == cron


def test_a_schedule_slices_cannot_start_at_round_times_is_refused():
    with pytest.raises(ValueError, match="must divide the hour"):
        as_cron("7m")
    with pytest.raises(ConfigError, match="SLICEWISE_SCHEDULE: schedule 'every hour': not a cron"):
        schedule({"SLICEWISE_SCHEDULE": "every hour"})
    assert schedule({}) == "0 * * * *"


def test_a_pipeline_names_its_own_schedule(tmp_path):
    path = tmp_path / "pipelines.yaml"
    path.write_text(
        "pipelines:\n  fast:\n    topic: t\n    key: [id]\n    event_time: at\n    schedule: 7m\n"
        "    fields:\n      id: {type: string, required: true}\n"
        "      at: {type: timestamp, required: true}\n"
    )
    with pytest.raises(PipelineDefinitionError, match=r"pipelines.yaml:6 pipelines.fast.schedule"):
        load_pipelines(path)
    path.write_text(path.read_text().replace("7m", "5m"))
    assert load_pipelines(path)["fast"].schedule == "*/5 * * * *"


def test_the_driver_listens_where_the_server_does_and_executors_dial_its_host():
    from slicewise.connect_server import SparkConnectServer, server_command, server_conf

    alone = server_conf(15002, "local[*]")  # one host: everything on loopback, as before
    assert (alone["spark.driver.bindAddress"], alone["spark.driver.host"]) == ("127.0.0.1",) * 2
    shared = server_conf(15002, "spark://10.251.7.1:7077", bind="10.251.7.1")
    assert shared["spark.driver.host"] == "10.251.7.1"  # the address other hosts reach
    assert shared["spark.connect.grpc.binding.address"] == "10.251.7.1"
    container = server_conf(15002, "spark://master:7077", "0.0.0.0", driver_host="spark-connect")
    assert (container["spark.driver.bindAddress"], container["spark.driver.host"]) == (
        "0.0.0.0",
        "spark-connect",
    )
    assert "spark.driver.host" not in server_conf(15002, "spark://m:7077", "0.0.0.0")  # Spark's
    assert SparkConnectServer(Path("/nowhere"), 15002, bind="0.0.0.0").url == "sc://127.0.0.1:15002"
    assert SparkConnectServer(Path("/nowhere"), 7, bind="10.251.7.1").url == "sc://10.251.7.1:7"
    # The deployment's own settings win (fixed ports behind a firewall).
    command = server_command(
        15002, "local[*]", driver_host="h", extra_conf={"spark.driver.port": "7078"}
    )
    assert "spark.driver.port=7078" in command and "spark.driver.host=h" in command
