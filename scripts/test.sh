#!/usr/bin/env bash
# The test command for a fresh machine. Run from anywhere:
#   bash scripts/test.sh [pytest args...]
# Creates .venv if missing, installs the project with its test extras, makes
# sure redis-server is on PATH (the suite starts its own private servers on
# free loopback ports; it never uses an existing Redis) and that Debian's
# chromium is there for the admin's browser tests, then runs pytest and exits
# with pytest's status.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

EXTRAS="[test]" NEED_REDIS=1 NEED_CHROMIUM=1 source scripts/setup.sh

# A package install may start a system Redis service; the tests ignore it.
exec .venv/bin/python -m pytest "$@"
