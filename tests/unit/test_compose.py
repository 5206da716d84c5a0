"""docker-compose.yml cannot run here (no Docker engine). Instead: it is valid against the
Compose specification's own JSON schema, and everything it names agrees with the code.

The schema is compose-go's `schema/compose-spec.json` (github.com/compose-spec/compose-go/v2
v2.16.2, Apache-2.0), vendored under tests/unit/schemas/. Refresh it with
`go mod download -json github.com/compose-spec/compose-go/v2@latest` and copy the file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from jsonschema import Draft202012Validator

from slicewise import connect_server
from slicewise.config import LOCAL_BOOTSTRAP
from slicewise.connect_server import DEFAULT_PORT
from slicewise_dev.broker import KAFKA_VERSION
from slicewise_dev.spark_cluster import MASTER, WORKER

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = SPEC["services"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
AIRFLOW = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")


def test_compose_file_is_valid_against_the_compose_specification():
    schema = json.loads((Path(__file__).parent / "schemas" / "compose-spec.json").read_text())
    errors = sorted(Draft202012Validator(schema).iter_errors(SPEC), key=lambda e: e.json_path)
    assert not errors, "\n".join(f"{e.json_path}: {e.message}" for e in errors)


def test_the_schema_check_catches_a_broken_file():
    broken = {**SPEC, "services": {"kafka": {**SERVICES["kafka"], "ports": "19092"}}}
    schema = json.loads((Path(__file__).parent / "schemas" / "compose-spec.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(broken))


def test_every_component_of_the_stack_is_there():
    expected = {
        "kafka",
        "kafka-init",
        "postgres",
        "spark-master",
        "spark-worker",
        "spark-connect",
        "airflow-init",
    }
    assert expected | set(AIRFLOW) <= set(SERVICES)
    assert SERVICES["spark-worker"]["deploy"]["replicas"] >= 2


def test_kafka_is_configured_like_our_local_broker():
    kafka = SERVICES["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    assert SERVICES["kafka-init"]["image"] == kafka["image"]
    env = kafka["environment"]
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    advertised = dict(
        listener.split("://") for listener in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    )
    # The host reaches it where our CLI looks by default; containers where the DAG looks.
    assert advertised["EXTERNAL"] == LOCAL_BOOTSTRAP
    assert f"{LOCAL_BOOTSTRAP}:{LOCAL_BOOTSTRAP.split(':')[1]}" in kafka["ports"]
    bootstrap = airflow_env("airflow-scheduler")["SLICEWISE_KAFKA_BOOTSTRAP"]
    assert advertised["PLAINTEXT"] == bootstrap
    init = SERVICES["kafka-init"]["command"]
    assert init[init.index("--bootstrap-server") + 1] == bootstrap
    from slicewise.pipelines import load_pipelines

    # The topic of the image's pipelines.yaml, which the services read (no override).
    assert "SLICEWISE_TOPIC" not in airflow_env("airflow-scheduler")
    assert (
        init[init.index("--topic") + 1] == load_pipelines(ROOT / "pipelines.yaml")["events"].topic
    )


def test_airflow_runs_on_the_postgres_service():
    pg = SERVICES["postgres"]["environment"]
    for name in (*AIRFLOW, "airflow-init"):
        url = urlsplit(airflow_env(name)["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        assert url.scheme == "postgresql+psycopg2"
        assert (url.username, url.password, url.hostname, url.port, url.path) == (
            pg["POSTGRES_USER"],
            pg["POSTGRES_PASSWORD"],
            "postgres",
            5432,
            f"/{pg['POSTGRES_DB']}",
        )
    assert "psycopg2-binary" in (ROOT / "requirements.txt").read_text()


def test_every_airflow_command_is_one_the_airflow_cli_accepts():
    from airflow.cli import cli_parser

    parser = cli_parser.get_parser()
    for name in (*AIRFLOW, "airflow-init"):
        command = SERVICES[name]["command"]
        if command[:3] == ["python", "-m", "slicewise.preloaded_scheduler"]:
            # `airflow scheduler` with the steps' libraries imported (see its docstring).
            command = ["airflow", "scheduler", *command[3:]]
        assert command[0] == "airflow"
        assert callable(parser.parse_args(command[1:]).func), name
    assert SERVICES["airflow-scheduler"]["command"][:3] == [
        "python",
        "-m",
        "slicewise.preloaded_scheduler",
    ]


def test_airflow_components_reach_each_other_and_the_spark_master():
    env = airflow_env("airflow-scheduler")
    api = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    apiserver = SERVICES["airflow-apiserver"]["command"]
    assert api.hostname == "airflow-apiserver"
    assert str(api.port) == apiserver[apiserver.index("--port") + 1]
    assert f"127.0.0.1:{api.port}:{api.port}" in SERVICES["airflow-apiserver"]["ports"]
    # Everyone signs and checks task tokens with one secret.
    assert len({airflow_env(n)["AIRFLOW__API_AUTH__JWT_SECRET"] for n in AIRFLOW}) == 1

    master = SERVICES["spark-master"]["command"]
    conn = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert conn["host"] == f"spark://spark-master:{master[master.index('--port') + 1]}"
    assert SERVICES["spark-worker"]["command"][-1] == conn["host"]
    # Executors connect back to the driver, which runs in the scheduler's tasks.
    assert SERVICES["airflow-scheduler"]["hostname"] == "airflow-scheduler"

    # The connect mode: the steps reach the server, which drives the same master.
    server = SERVICES["spark-connect"]
    connect = json.loads(env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    assert connect["conn_type"] == "spark_connect" and connect["host"] == server["hostname"]
    assert connect["port"] == DEFAULT_PORT
    # The server and its clients hold the same token, which the file never sets itself.
    token = server["environment"]["SLICEWISE_SPARK_TOKEN"]
    assert connect["password"] == "${SLICEWISE_SPARK_TOKEN}" and token.startswith(
        "${SLICEWISE_SPARK_TOKEN:?"
    )
    assert env["SLICEWISE_SPARK_REMOTE"] == f"sc://{server['hostname']}:{DEFAULT_PORT}"
    command = server["command"]
    assert command[:4] == ["python", "-m", "slicewise.connect_server", "run"]
    assert command[command.index("--master") + 1] == conn["host"]
    assert command[command.index("--bind") + 1] == "0.0.0.0"
    assert server["environment"]["SLICEWISE_LAKEHOUSE"] == env["SLICEWISE_LAKEHOUSE"]


def test_the_spark_services_are_the_multi_host_recipe_of_the_scale_out_test():
    """test_scale_out runs the master at an address the other hosts reach, the worker
    (and its executors) on another host given the master's URL, and the Connect server's
    driver bound for them with `--driver-host` naming that address. Here each is a
    service name, which the other containers resolve."""
    master = SERVICES["spark-master"]["command"]
    url = f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"
    assert url == "spark://spark-master:7077"
    assert SERVICES["spark-worker"]["command"][-1] == url
    server = SERVICES["spark-connect"]
    args = connect_server.parser().parse_args(server["command"][3:])
    assert (args.master, args.bind, args.driver_host) == (url, "0.0.0.0", server["hostname"])


def test_spark_runs_the_daemons_our_cluster_tests_start():
    # The scale-out tests start these classes from the pyspark wheel the image installs.
    for name, daemon in (("spark-master", MASTER), ("spark-worker", WORKER)):
        command = SERVICES[name]["command"]
        assert command[:2] == ["spark-class", daemon]


def test_the_image_is_built_from_our_lock_file_and_holds_what_the_services_use():
    assert "-c constraints.txt" in DOCKERFILE  # same pyspark, Airflow, Delta as .venv
    assert re.search(r"^FROM python:3\.11", DOCKERFILE, re.M)
    assert "openjdk-17" in DOCKERFILE  # spark-submit and the Spark daemons need Java 17
    workdir = re.search(r"^WORKDIR (\S+)", DOCKERFILE, re.M).group(1)
    for folder in ("dags", "spark_jobs", "include", "scripts"):
        assert re.search(rf"^COPY {folder} \./{folder}$", DOCKERFILE, re.M), folder
    # Before the first import of slicewise (the jar step): settings read the definitions.
    assert DOCKERFILE.index("COPY pipelines.yaml ./") < DOCKERFILE.index("from slicewise")
    assert airflow_env("airflow-scheduler")["AIRFLOW__CORE__DAGS_FOLDER"] == f"{workdir}/dags"
    for name in (*AIRFLOW, "airflow-init", "spark-master", "spark-worker"):
        assert SERVICES[name]["image"] == "slicewise:local" and SERVICES[name]["build"] == "."


def test_the_lakehouse_is_shared_by_drivers_and_executors_at_one_path():
    lakehouse = airflow_env("airflow-scheduler")["SLICEWISE_LAKEHOUSE"]
    for name in ("airflow-scheduler", "spark-worker"):
        assert f"lakehouse:{lakehouse}" in SERVICES[name]["volumes"], name


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_named_volumes_are_declared_and_ports_stay_on_loopback(name):
    service = SERVICES[name]
    for volume in service.get("volumes", []):
        assert volume.split(":")[0] in SPEC["volumes"], volume
    for port in service.get("ports", []):
        assert port.startswith("127.0.0.1:"), port
    for dependency in service.get("depends_on", {}):
        assert dependency in SERVICES, dependency


def airflow_env(name: str) -> dict[str, str]:
    return SERVICES[name]["environment"]
