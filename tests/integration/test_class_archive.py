"""`slicewise class-archive`: a real JVM records its classes once, and the next driver
`get_spark` starts maps them from the archive (HotSpot's own class-loading log says
where each class came from)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from slicewise.config import load_settings
from slicewise.spark import classic_env, spark_jars
from slicewise_dev.airflow_env import VENV_BIN

pytestmark = pytest.mark.integration

DRIVER = """
import json, sys
from slicewise.spark import get_spark
spark = get_spark("slicewise-archived", extra_conf={
    "spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=%s",
})
print(json.dumps({"rows": spark.range(10).count()}))
"""


def test_a_recorded_class_archive_starts_the_next_driver(tmp_path: Path) -> None:
    # A cache of its own (the jars linked in, not fetched again), so the archive is new.
    jars = spark_jars(load_settings())[0].parent
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / jars.name).symlink_to(jars)
    env = {
        **classic_env({k: v for k, v in os.environ.items() if k != "SLICEWISE_SPARK_REMOTE"}),
        "SLICEWISE_CACHE_DIR": str(cache),
        "SLICEWISE_STATE_DIR": str(tmp_path / "state"),
    }

    wrote = subprocess.run(
        [str(VENV_BIN / "slicewise"), "class-archive"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr[-3000:]
    [archive] = (cache / "jvm-classes").glob("driver-*.jsa")
    assert f"class archive {archive} written in" in wrote.stdout
    assert archive.stat().st_size > 50 * 2**20  # Spark's and Delta's classes, not a stub
    assert list((cache / "jvm-classes").glob("*.partial")) == []

    log = tmp_path / "classes.log"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER % log)
    ran = subprocess.run(
        [str(VENV_BIN / "python"), str(driver)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    # Only the step's own line on stdout: HotSpot's sharing log is kept off it.
    assert ran.stdout.strip().splitlines() == ['{"rows": 10}'], ran.stdout
    spark_classes = [line for line in log.read_text().splitlines() if " org.apache.spark." in line]
    shared = [line for line in spark_classes if "source: shared objects file (top)" in line]
    # Most of Spark's classes came from the archive this test wrote, not from the jars
    # (the JDK's own archive holds none of them).
    assert len(shared) > 2_000 and len(shared) > 0.5 * len(spark_classes), (
        len(shared),
        len(spark_classes),
    )
