#!/usr/bin/env bash
# Shared set-up for scripts/test.sh and scripts/demo.sh, sourced from the repo
# root:  EXTRAS="[test]" NEED_REDIS=1 source scripts/setup.sh
# Creates .venv if missing, installs the project (with EXTRAS) into it, and
# installs redis-server with apt-get when NEED_REDIS=1 and it is not on PATH.

if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv"
    python3 -m venv .venv
fi

echo "== installing echomq-django${EXTRAS:-} into .venv"
.venv/bin/python -m pip install -q -e ".${EXTRAS:-}"

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
