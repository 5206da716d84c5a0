"""Where the pipelines file and the state live when no variable says: the checkout when
run from one, else SLICEWISE_HOME, AIRFLOW_HOME or the working directory; never inside
the installed package."""

from __future__ import annotations

from pathlib import Path

import pytest

from slicewise import home
from slicewise.config import state_folder
from slicewise.pipelines import definitions_file
from slicewise.spark import SPARK_POM, spark_packages


def test_run_from_the_checkout_the_checkout_is_home():
    assert home.from_checkout()
    assert definitions_file({}) == home.REPO_ROOT / "pipelines.yaml"
    assert state_folder({}) == home.REPO_ROOT / ".state"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLICEWISE_HOME": "/srv/slicewise", "AIRFLOW_HOME": "/opt/airflow"}, "/srv/slicewise"),
        ({"AIRFLOW_HOME": "/opt/airflow"}, "/opt/airflow"),
        ({}, "<cwd>"),
    ],
)
def test_installed_home_is_the_deployments_never_site_packages(
    monkeypatch, tmp_path, env, expected
):
    monkeypatch.setattr(home, "from_checkout", lambda: False)
    monkeypatch.chdir(tmp_path)
    where = tmp_path if expected == "<cwd>" else Path(expected)
    assert definitions_file(env) == where / "pipelines.yaml"
    assert state_folder(env) == where / ".state"
    # The variables still win over any home.
    assert definitions_file({**env, "SLICEWISE_PIPELINES_FILE": "/x/p.yaml"}) == Path("/x/p.yaml")
    assert state_folder({**env, "SLICEWISE_STATE_DIR": "/x/state"}) == Path("/x/state")


def test_the_spark_jars_are_package_data_and_print_as_maven_coordinates():
    assert SPARK_POM.parent == Path(home.__file__).parent  # inside the package
    packages = spark_packages()
    assert all(len(p.split(":")) == 3 and "$" not in p for p in packages)
    names = {p.rsplit(":", 1)[0] for p in packages}
    assert {"io.delta:delta-spark_4.1_2.13", "org.apache.spark:spark-sql-kafka-0-10_2.13"} <= names
