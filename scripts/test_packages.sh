#!/usr/bin/env bash
# Debian packages the integration tests start or drive, installed once if missing:
# PostgreSQL (the production-shaped test runs Airflow on a private server), Redis
# (its Celery broker) and Chromium (the browser tests drive it with Playwright).
set -euo pipefail
missing=()
compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v chromium >/dev/null || missing+=(chromium)
if (( ${#missing[@]} )); then
  echo "==> Debian packages for the tests: ${missing[*]}"
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
