#!/usr/bin/env bash
# `make test`: every phase in turn, each timed, and a summary of the wall times at the
# end (pytest prints its 25 slowest tests above it), so a phase that grew shows at once.
# Debian's packages install beside the bootstrap, and the other Pythons' venvs beside
# pytest (the registry and the disk, not the cores, are what those installs wait on);
# their unit tiers run after it.
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
bash scripts/test_pythons.sh install >"$tiers_log" 2>&1 &
installing=$!
phase pytest .venv/bin/python -m pytest "$@"
if ! wait "$installing"; then
  cat "$tiers_log" >&2
  exit 1
fi
summary+=("$(printf '%-22s %5ss' "other Pythons' venvs" $(( $(date +%s) - t0 ))) (beside pytest)")
rm -f "$tiers_log"
phase "unit tier, 3 Pythons" bash scripts/test_pythons.sh run
