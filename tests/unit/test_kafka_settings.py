"""librdkafka settings -> the Java client's, and an Airflow connection -> our variables."""

import json

import pytest
from airflow.sdk import Connection

from slicewise.config import ConfigError, load_settings
from slicewise.kafka.security import env_from_connection, java_props


def test_sasl_credentials_become_the_java_clients_jaas_config():
    props = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "etl",
        "sasl.password": 'p"w\\d',
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "client.id": "slicewise",
    }
    assert java_props(props) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="etl" password="p\\"w\\\\d";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/kafka/ca.pem",
        "client.id": "slicewise",
    }


def test_java_only_properties_win_over_derived_ones():
    props = {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required username=x;"
    assert java_props(props, {"sasl.jaas.config": jaas})["sasl.jaas.config"] == jaas


def test_without_security_settings_nothing_is_added():
    assert java_props({}) == {}


def test_credentials_without_a_password_mechanism_fail_fast_with_what_to_set():
    env = {
        "SLICEWISE_KAFKA_PROP_SASL_MECHANISM": "GSSAPI",
        "SLICEWISE_KAFKA_PROP_SASL_USERNAME": "etl",
    }
    with pytest.raises(ConfigError, match="SLICEWISE_KAFKA_SPARK_PROP_SASL_JAAS_CONFIG"):
        load_settings(env)


def test_settings_give_each_client_its_own_spelling():
    s = load_settings(
        {
            "SLICEWISE_KAFKA_PROP_SASL_MECHANISM": "PLAIN",
            "SLICEWISE_KAFKA_PROP_SASL_USERNAME": "etl",
            "SLICEWISE_KAFKA_PROP_SASL_PASSWORD": "secret",
            "SLICEWISE_KAFKA_SPARK_PROP_CLIENT_RACK": "rack-1",
        }
    )
    assert dict(s.kafka_props) == {
        "sasl.mechanism": "PLAIN",
        "sasl.username": "etl",
        "sasl.password": "secret",
    }
    assert s.spark_kafka_props == {
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="etl" password="secret";',
        "client.rack": "rack-1",
    }


def test_an_airflow_connection_becomes_our_variables():
    conn = Connection(
        conn_id="kafka_prod",
        conn_type="kafka",
        host="b1:9093,b2:9093",
        login="etl",
        password="secret",
        extra=json.dumps(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-256",
                "spark": {"ssl.endpoint.identification.algorithm": "https"},
            }
        ),
    )
    env = env_from_connection(conn)
    assert env == {
        "SLICEWISE_KAFKA_BOOTSTRAP": "b1:9093,b2:9093",
        "SLICEWISE_KAFKA_PROP_SECURITY_PROTOCOL": "SASL_SSL",
        "SLICEWISE_KAFKA_PROP_SASL_MECHANISM": "SCRAM-SHA-256",
        "SLICEWISE_KAFKA_PROP_SASL_USERNAME": "etl",
        "SLICEWISE_KAFKA_PROP_SASL_PASSWORD": "secret",
        "SLICEWISE_KAFKA_SPARK_PROP_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "https",
    }
    s = load_settings(env)
    assert s.bootstrap_servers == "b1:9093,b2:9093"
    assert s.spark_kafka_props["ssl.endpoint.identification.algorithm"] == "https"


def test_a_connection_with_one_host_and_a_port_is_a_bootstrap_server():
    conn = Connection(conn_id="k", conn_type="kafka", host="kafka", port=9092)
    assert env_from_connection(conn) == {"SLICEWISE_KAFKA_BOOTSTRAP": "kafka:9092"}


def test_a_connection_without_host_fails_with_what_to_set():
    with pytest.raises(ConfigError, match="set it to the Kafka bootstrap servers"):
        env_from_connection(Connection(conn_id="k", conn_type="kafka"))
