#!/usr/bin/env bash
# The test command for a fresh machine. Run from anywhere:
#   bash scripts/test.sh [pytest args...]
# Creates .venv if missing, installs the project with its test extras, makes
# sure redis-server is on PATH (the suite starts its own private servers on
# free loopback ports; it never uses an existing Redis), then runs pytest and
# exits with pytest's status.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv"
    python3 -m venv .venv
fi

echo "== installing echomq-django[test] into .venv"
.venv/bin/python -m pip install -q -e ".[test]"

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
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

# A package install may start a system Redis service; the tests ignore it.
exec .venv/bin/python -m pytest "$@"
