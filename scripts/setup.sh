#!/usr/bin/env bash
# Shared set-up for scripts/test.sh and scripts/demo.sh, sourced from the repo
# root:  EXTRAS="[test]" NEED_REDIS=1 source scripts/setup.sh
# Creates .venv if missing, installs the project (with EXTRAS) into it, and
# installs redis-server with apt-get when NEED_REDIS=1 and it is not on PATH,
# and Debian's chromium (the admin's browser tests drive it through Playwright;
# Playwright's own browser download is not used) when NEED_CHROMIUM=1 and
# /usr/bin/chromium is missing.

if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv"
    python3 -m venv .venv
fi

echo "== installing echomq-django${EXTRAS:-} into .venv"
.venv/bin/python -m pip install -q -e ".${EXTRAS:-}"

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
