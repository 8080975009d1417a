#!/usr/bin/env bash
# Shared set-up for scripts/test.sh, scripts/demo.sh and scripts/bench.sh,
# sourced from the repo root:
#   EXTRAS="[test]" NEED_REDIS=1 source scripts/setup.sh
# Creates the venv if missing (VENV, default .venv, made with PYTHON, default
# python3), installs the project (with EXTRAS, plus the requirement specs in
# PIP_EXTRA, e.g. "Django>=6,<7") into it, installs redis-server with apt-get
# when NEED_REDIS=1 and it is not on PATH, and Debian's chromium (the admin's
# browser tests drive it through Playwright; Playwright's own browser download
# is not used) when NEED_CHROMIUM=1 and /usr/bin/chromium is missing.

VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV with ${PYTHON:-python3}"
    "${PYTHON:-python3}" -m venv "$VENV"
fi

echo "== installing echomq-django${EXTRAS:-} ${PIP_EXTRA:-}into $VENV"
# shellcheck disable=SC2086  # PIP_EXTRA is a list of requirement specs
"$VENV/bin/python" -m pip install -q -e ".${EXTRAS:-}" ${PIP_EXTRA:-}

# apt_install PACKAGE: as root, or through sudo; refreshes the lists once if needed
apt_install() {
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! $sudo apt-get install -y -q "$1"; then
        $sudo apt-get update -q
        $sudo apt-get install -y -q "$1"
    fi
}

if [ "${NEED_REDIS:-1}" = "1" ] && \
   { ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; }; then
    echo "== installing redis-server"
    apt_install redis-server
fi

if [ "${NEED_CHROMIUM:-0}" = "1" ] && [ ! -x /usr/bin/chromium ]; then
    echo "== installing chromium (for the admin's browser tests)"
    apt_install chromium
fi
