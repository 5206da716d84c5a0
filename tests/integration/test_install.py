"""slicewise as a library: the wheel `python -m build` would make lists its dependencies
(ranges), ships the product and its package data and no dev stack, and installs from
PyPI's registry into fresh venvs on the oldest and newest Python it supports, where it
runs from a directory outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from slicewise.home import REPO_ROOT
from slicewise_dev.airflow_env import VENV_BIN

pytestmark = pytest.mark.integration

PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def interpreter(version: str) -> Path:
    """pyenv's `python<version>` (the machines have 3.10 to 3.13 beside the default)."""
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    assert found, f"no Python {version} under {PYENV}: install it with pyenv"
    return found[-1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO_ROOT)],
        check=True,
    )
    (built,) = out.glob("slicewise-*.whl")
    return built


def test_the_wheel_is_the_product_with_its_dependencies_and_no_dev_stack(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = Parser().parsestr(
            z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        )
    assert "slicewise/spark-jars.pom.xml" in names  # runtime data is package data
    assert not [n for n in names if n.startswith("slicewise_dev")]
    assert metadata["Requires-Python"] == ">=3.10"
    requires = metadata.get_all("Requires-Dist")
    core = {r.split(";")[0].split("<")[0].split(">")[0] for r in requires if "extra ==" not in r}
    assert {"pyspark-client", "great-expectations", "confluent-kafka", "obstore"} <= core
    assert "pyspark" not in core  # the thin Connect client only: no JVM on a worker
    airflow = [r for r in requires if 'extra == "airflow"' in r]
    assert any(r.startswith("apache-airflow<4,>=3.2") for r in airflow)
    assert not [r for r in requires if "==" in r.split(";")[0]]  # ranges, never pins
    scripts = entry_points(wheel)
    assert "slicewise = slicewise.cli:main" in scripts and "slicewise-produce" not in scripts


def entry_points(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()


@pytest.mark.parametrize("version", ["3.10", "3.13"])
def test_the_wheel_installs_and_runs_outside_the_checkout(wheel, version, tmp_path):
    venv = tmp_path / "venv"
    uv = shutil.which("uv", path=str(VENV_BIN)) or "uv"
    subprocess.run([uv, "venv", "-q", "--python", str(interpreter(version)), str(venv)], check=True)
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)],
        check=True,
    )
    elsewhere = tmp_path / "deployment"  # a folder of its own: no checkout in sight
    elsewhere.mkdir()
    shutil.copy(
        REPO_ROOT / "docs" / "examples" / "two-pipelines.yaml", elsewhere / "pipelines.yaml"
    )
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AIRFLOW_HOME": str(elsewhere),
    }
    shown = subprocess.run(
        [str(venv / "bin" / "slicewise"), "pipelines"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    # The default definitions file is the deployment's (AIRFLOW_HOME), not the package's.
    assert f"{elsewhere / 'pipelines.yaml'}: 2 pipeline(s), all valid" in shown.stdout
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.util, slicewise, slicewise.spark as s; "
            "print(importlib.util.find_spec('slicewise_dev') is None, "
            "importlib.util.find_spec('py4j') is None, s.SPARK_POM.is_file(), slicewise.__file__)",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    no_dev, no_jvm_bridge, pom, where = probe.stdout.split()
    assert (no_dev, no_jvm_bridge, pom) == ("True", "True", "True")
    assert str(venv) in where and str(REPO_ROOT) not in where
