#!/usr/bin/env bash
# Shared set-up for scripts/test.sh, scripts/demo.sh and scripts/bench.sh,
# sourced from the repo root:
#   EXTRAS="[test]" NEED_REDIS=1 source scripts/setup.sh
# Creates the venv if missing (VENV, default .venv, made with PYTHON, default
# python3), installs the project (with EXTRAS, plus the requirement specs in
# PIP_EXTRA, e.g. "Django>=6,<7") into it, and installs redis-server with
# apt-get when NEED_REDIS=1 and it is not on PATH.

VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV with ${PYTHON:-python3}"
    "${PYTHON:-python3}" -m venv "$VENV"
fi

echo "== installing echomq-django${EXTRAS:-} ${PIP_EXTRA:-}into $VENV"
# shellcheck disable=SC2086  # PIP_EXTRA is a list of requirement specs
"$VENV/bin/python" -m pip install -q -e ".${EXTRAS:-}" ${PIP_EXTRA:-}

if [ "${NEED_REDIS:-1}" = "1" ] && \
   { ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; }; then
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
