"""`python -m slicewise.preloaded_scheduler`: the scheduler whose forks start with the steps' libraries."""

from __future__ import annotations

import subprocess
import sys

from slicewise.preloaded_scheduler import PRELOAD


def test_preload_imports_the_heavy_libraries_and_starts_nothing_a_fork_would_inherit():
    # In a process of its own: this one has imported half of them already.
    probe = (
        "import os, sys, threading\n"
        "from slicewise.preloaded_scheduler import preload\n"
        "from slicewise.spark import CONNECT_SWITCHES\n"
        "before = [os.environ.get(k) for k in CONNECT_SWITCHES]\n"
        "preload()\n"
        "print(threading.active_count(), 'great_expectations' in sys.modules,\n"
        "      'pyspark.sql.connect.session' in sys.modules,\n"
        "      [os.environ.get(k) for k in CONNECT_SWITCHES] == before)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    # One thread, the two heavy libraries loaded, and no Connect switch set in the
    # environment (pyspark sets those once a process opens a Connect session).
    assert out == ["1", "True", "True", "True"], out
    assert PRELOAD[0] == "slicewise.gate"  # the heaviest: Great Expectations


def test_it_takes_the_airflow_scheduler_arguments():
    out = subprocess.run(
        [sys.executable, "-m", "slicewise.preloaded_scheduler", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "airflow scheduler" in out and "--num-runs" in out
