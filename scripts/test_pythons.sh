#!/usr/bin/env bash
# The unit tier on every other Python the package supports (3.10, 3.12, 3.13; the main
# suite runs on 3.11, the lock's). Each gets a venv of its own (.venv-py3.X) with the
# package (an Airflow worker's install: the thin Spark client, no JVM) and the dev stack
# installed from their declared ranges, not the 3.11 lock: what a user on that Python
# resolves. Interpreters from pyenv (PYENV_ROOT).
# The venvs are installed one after the other (the registry and the disk are the
# bottleneck), then the three tiers run side by side, one process each: most of a tier
# is one process importing Airflow and Great Expectations, so -n 2 would not shorten it.
# No bytecode is compiled at install: a tier imports a small part of what it installs.
# The tiers write bytecode as they import instead (even where PYTHONDONTWRITEBYTECODE is
# set), so the subprocesses a test starts find it. On 3.12, install and tier took 47 s
# of CPU this way against 53 s with `--compile-bytecode` (2026-12-05).
set -euo pipefail
cd "$(dirname "$0")/.."
versions=${SLICEWISE_TEST_PYTHONS:-3.10 3.12 3.13}
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
# The test tools at requirements-dev.txt's ranges (one place for them, e.g. pytest < 9.2).
mapfile -t test_tools < <(sed -nE 's/^((pytest|hypothesis)[^ #]*).*/\1/p' requirements-dev.txt)
for v in $versions; do
  python=$(ls -d "$pyenv_root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V | tail -1)
  [[ -n $python ]] || { echo "Python $v is needed for the unit tier (pyenv install $v)" >&2; exit 1; }
  venv=.venv-py$v
  echo "==> Python $v: $venv"
  [[ -x $venv/bin/python ]] || .venv/bin/uv venv -q --python "$python" "$venv"
  VIRTUAL_ENV=$venv .venv/bin/uv pip install -q -e ".[airflow]" -e scripts/dev-package \
    "${test_tools[@]}"
done
logs=$(mktemp -d)
declare -A tier
for v in $versions; do
  # The protocol model is pure Python over tuples: the main tier runs it once.
  env -u PYTHONDONTWRITEBYTECODE .venv-py"$v"/bin/python -m pytest tests/unit -q -p no:randomly -o addopts="-n 0" \
    --ignore tests/unit/test_slice_protocol.py \
    >"$logs/$v.log" 2>&1 &
  tier[$v]=$!
done
failed=()
for v in $versions; do
  wait "${tier[$v]}" || failed+=("$v")
  echo "==> unit tier on Python $v: $(tail -1 "$logs/$v.log")"
done
for v in "${failed[@]}"; do
  echo "==> Python $v failed:" >&2
  cat "$logs/$v.log" >&2
done
rm -rf "$logs"
(( ${#failed[@]} == 0 ))
