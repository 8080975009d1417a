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

if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv"
    python3 -m venv .venv
fi

echo "== installing echomq-django into .venv"
.venv/bin/python -m pip install -q -e .

if [ -z "${ECHOMQ_URL:-}" ] && ! command -v redis-server >/dev/null 2>&1; then
    echo "== installing redis-server"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! $SUDO apt-get install -y -q redis-server; then
        $SUDO apt-get update -q
        $SUDO apt-get install -y -q redis-server
    fi
fi

# A package install may start a system Redis service; the demo ignores it
# and starts its own server on a free port.
exec .venv/bin/python manage.py orders_demo "$@"
