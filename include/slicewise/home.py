"""Where a deployment keeps its pipeline definitions and state when no variable says.

Installed (a wheel in an Airflow image), nothing may point into site-packages: the
home is SLICEWISE_HOME, else AIRFLOW_HOME (the scheduler's and every worker's), else
the working directory. Run from a checkout (`make demo`, the tests), it is the
checkout. SLICEWISE_PIPELINES_FILE and SLICEWISE_STATE_DIR override each path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout, when run from one


def from_checkout() -> bool:
    """Whether this package is the checkout's `include/slicewise` (an editable install
    or PYTHONPATH), not a copy installed into site-packages."""
    package = Path(__file__).resolve().parent
    return (
        REPO_ROOT / "pyproject.toml"
    ).is_file() and package == REPO_ROOT / "include" / "slicewise"


def home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("SLICEWISE_HOME", "").strip():
        return Path(env["SLICEWISE_HOME"].strip()).expanduser()
    if from_checkout():
        return REPO_ROOT
    if env.get("AIRFLOW_HOME", "").strip():
        return Path(env["AIRFLOW_HOME"].strip()).expanduser()
    return Path.cwd()


def default_pipelines_file(env: Mapping[str, str] | None = None) -> Path:
    return home(env) / "pipelines.yaml"


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    return home(env) / ".state"
