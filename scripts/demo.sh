#!/usr/bin/env bash
# The demo for a fresh machine. Run from anywhere:
#   bash scripts/demo.sh [--orders N] [--from-csv FILE] [--keep] [other orders_demo options]
# Creates .venv if missing, installs the project into it, makes sure
# redis-server is on PATH (unless ECHOMQ_URL names a Redis to use), then runs
# `manage.py orders_demo`, which migrates SQLite, starts a private Redis on a
# free loopback port, the web server, runworker and runpump, posts the
# orders, checks every flow and stops everything it started. Exits with the
# command's status (0: every order ended in its predicted state).
# `.venv/bin/python manage.py orders_demo --help` lists every option.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# redis-server is needed unless ECHOMQ_URL names a Redis to use
NEED_REDIS=$([ -z "${ECHOMQ_URL:-}" ] && echo 1 || echo 0) EXTRAS="[django-redis,tasks]" source scripts/setup.sh

# A package install may start a system Redis service; the demo ignores it
# and starts its own server on a free port.
exec .venv/bin/python manage.py orders_demo "$@"
