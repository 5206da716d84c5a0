"""Which class archive a driver starts from: one per JDK, Spark and jar set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slicewise.class_archive import ClassArchive, write_archive
from slicewise.errors import ConfigError


@pytest.fixture
def java_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    return java


def test_another_jar_set_or_jdk_build_names_another_archive(java_home: Path, tmp_path: Path):
    jars = [tmp_path / "delta-spark_2.13-4.0.0.jar"]
    first = ClassArchive.of(tmp_path / "cache", jars)
    assert first == ClassArchive.of(tmp_path / "cache", jars)
    assert first != ClassArchive.of(tmp_path / "cache", [tmp_path / "delta-spark_2.13-4.0.1.jar"])
    os.utime(java_home, ns=(0, 1))  # an updated JDK: the same path, a new binary
    assert first != ClassArchive.of(tmp_path / "cache", jars)
    assert first.path.parent == tmp_path / "cache" / "jvm-classes"


def test_a_driver_maps_the_archive_only_once_it_is_written(java_home: Path, tmp_path: Path):
    archive = ClassArchive.of(tmp_path / "cache", [])
    assert archive.driver_options() is None
    archive.path.parent.mkdir(parents=True)
    archive.path.write_bytes(b"")
    options = archive.driver_options()
    # HotSpot's own sharing log stays off the driver's stdout, where a step's JSON goes.
    assert options == f"-XX:SharedArchiveFile={archive.path} -Xlog:cds*=off"


def test_no_jdk_no_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ClassArchive.of(tmp_path / "cache", []) is None


def test_without_a_jdk_writing_one_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))

    def start(options: str):
        raise AssertionError("no driver starts without a JDK")

    # A ConfigError: the CLI prints its one line and exits 2, no traceback.
    with pytest.raises(ConfigError, match="no JDK found: set JAVA_HOME"):
        write_archive(tmp_path / "cache", [], start)
    assert not (tmp_path / "cache").exists()
