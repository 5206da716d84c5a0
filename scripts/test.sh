#!/usr/bin/env bash
# `make test`: every phase in turn, each timed, and a summary of the wall times at the
# end (pytest prints its 25 slowest tests above it), so a phase that grew shows at once.
# Debian's packages install beside the bootstrap, and the other Pythons' venvs and
# unit tiers beside pytest, at the lowest CPU priority: pytest leaves about a seventh of
# the two cores idle (it waits on Airflow, brokers and JVMs), which is more than the
# tiers need, so they no longer add a phase of their own at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
began=$(date +%s)
summary=()
trap 'printf "==> wall time of each phase\n"; printf "    %s\n" "${summary[@]}"; printf "    %-22s %5ss\n" total $(( $(date +%s) - began ))' EXIT

phase() {  # a failed phase is timed too, then ends the run with its code
  local name=$1 t0 code=0
  shift
  t0=$(date +%s)
  "$@" || code=$?
  local line
  line=$(printf '%-22s %5ss' "$name" $(( $(date +%s) - t0 )))
  if (( code )); then line+=" (failed)"; fi
  summary+=("$line")
  return "$code"
}

packages_log=$(mktemp)
t0=$(date +%s)
bash scripts/test_packages.sh >"$packages_log" 2>&1 &
packaging=$!
phase bootstrap bash scripts/bootstrap.sh
if ! wait "$packaging"; then
  cat "$packages_log" >&2
  exit 1
fi
cat "$packages_log"
summary+=("$(printf '%-22s %5ss' "debian packages" $(( $(date +%s) - t0 ))) (beside bootstrap)")
rm -f "$packages_log"
phase lint .venv/bin/ruff check .
tiers_log=$(mktemp)
t0=$(date +%s)
nice -n 19 bash scripts/test_pythons.sh >"$tiers_log" 2>&1 &
tiers=$!
# The CPU each kind of process spent meanwhile follows pytest's report: on two cores
# the suite's wall time cannot fall below half its CPU seconds.
phase pytest .venv/bin/python scripts/cpu_by_process.py -- .venv/bin/python -m pytest "$@"
tiers_code=0
wait "$tiers" || tiers_code=$?
cat "$tiers_log"
rm -f "$tiers_log"
line=$(printf '%-22s %5ss' "other Pythons' tiers" $(( $(date +%s) - t0 )))
if (( tiers_code )); then line+=" (failed)"; fi
summary+=("$line (venvs and unit tiers, beside pytest)")
exit "$tiers_code"
