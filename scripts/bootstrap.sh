#!/usr/bin/env bash
# Idempotent set-up: the virtualenv (.venv) from the lock file, then the jars
# (Spark's Delta + Kafka connector, the Kafka broker) into ~/.cache/slicewise.
# Re-running it does nothing unless requirements, constraints or poms changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"Python 3.11 is required, found {sys.version.split()[0]}"'
command -v java >/dev/null || { echo "Java 17 is required (java not on PATH)" >&2; exit 1; }
command -v mvn >/dev/null || { echo "Maven is required once to fetch jars from Maven Central (apt-get install maven)" >&2; exit 1; }

stamp_file=.venv/.slicewise-stamp
want=$(cat requirements.txt requirements-dev.txt constraints.txt pyproject.toml scripts/dev-package/pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [[ ! -f $stamp_file || $(cat "$stamp_file") != "$want" ]]; then
  echo "==> virtualenv .venv (Python deps from constraints.txt)"
  [[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip --version >/dev/null 2>&1 || .venv/bin/python -m ensurepip >/dev/null
  .venv/bin/python -m pip install -q "uv==0.13.8"
  # Bytecode now, once: every spark-submit and Airflow task is a new Python process, and
  # where PYTHONDONTWRITEBYTECODE is set (as on our CI machines) each would otherwise
  # compile its imports again (Great Expectations alone: ~20 s instead of ~4 s).
  VIRTUAL_ENV=.venv .venv/bin/uv pip install -q --compile-bytecode \
    -r requirements-dev.txt -c constraints.txt -e . -e scripts/dev-package
  # uv keeps every build of an sdist (pyspark is one, ~450 MB a build): without a prune the
  # cache grew by gigabytes a fresh clone until the disk was full.
  .venv/bin/uv cache prune -q
  echo "$want" > "$stamp_file"
fi

echo "==> jars (cached in ${SLICEWISE_CACHE_DIR:-$HOME/.cache/slicewise})"
.venv/bin/python - <<'PY'
from slicewise.config import load_settings
from slicewise_dev.broker import LocalBroker
from slicewise.spark import spark_jars

settings = load_settings()
print(f"    spark: {len(spark_jars(settings))} jars")
broker = LocalBroker(settings.state_dir, settings.cache_dir)
broker.ensure_jars()
print(f"    kafka broker: jars ready")
PY
