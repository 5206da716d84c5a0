import pytest

from slicewise.config import LOCAL_BOOTSTRAP, ConfigError, load_settings


def test_defaults_need_no_configuration(tmp_path):
    s = load_settings({"SLICEWISE_STATE_DIR": str(tmp_path)})
    assert s.bootstrap_servers == LOCAL_BOOTSTRAP
    assert s.lakehouse == str(tmp_path / "lakehouse")
    assert s.table("silver") == f"{tmp_path}/lakehouse/silver"
    assert s.dedup_horizon_days == 7


def test_kafka_properties_reach_the_python_clients_as_given():
    s = load_settings(
        {
            "SLICEWISE_KAFKA_PROP_SASL_MECHANISM": "PLAIN",
            "SLICEWISE_KAFKA_PROP_SECURITY_PROTOCOL": "SASL_SSL",
        }
    )
    assert dict(s.kafka_props) == {"sasl.mechanism": "PLAIN", "security.protocol": "SASL_SSL"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SLICEWISE_DEDUP_HORIZON_DAYS": "week"},
            "SLICEWISE_DEDUP_HORIZON_DAYS='week' is not an integer",
        ),
        ({"SLICEWISE_GRACE_SECONDS": "-5"}, "SLICEWISE_GRACE_SECONDS=-5 is below 0"),
        ({"SLICEWISE_TOPIC": "  "}, "SLICEWISE_TOPIC is blank"),
        ({"SLICEWISE_KAFKA_BOOTSTRAP": "kafka"}, "has no port"),
    ],
)
def test_bad_configuration_fails_fast_with_what_to_change(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_settings(env)


def test_the_ledger_lives_with_the_tables_unless_placed_elsewhere(tmp_path):
    assert load_settings({"SLICEWISE_LAKEHOUSE": "/data/lh"}).ledger_dir == "/data/lh/_ledger"
    placed = load_settings({"SLICEWISE_LAKEHOUSE": "s3a://b/lh", "SLICEWISE_LEDGER_DIR": "/mnt/l"})
    assert (placed.table("silver"), placed.ledger_dir) == ("s3a://b/lh/silver", "/mnt/l")


def test_the_ledger_follows_the_tables_onto_an_object_store_and_refuses_other_schemes():
    from slicewise.ledger import Ledger
    from slicewise.store import LocalFolder, ObjectStore

    settings = load_settings({"SLICEWISE_LAKEHOUSE": "s3a://bucket/lakehouse"})
    ledger = Ledger(settings.ledger_dir, settings.topic)
    assert isinstance(ledger.store, ObjectStore)
    assert str(ledger.store) == "s3a://bucket/lakehouse/_ledger/events"
    assert isinstance(Ledger("file:///data/lh/_ledger", "events").store, LocalFolder)
    with pytest.raises(ConfigError, match="set SLICEWISE_LEDGER_DIR"):
        Ledger("hdfs://namenode/lakehouse/_ledger", settings.topic)
