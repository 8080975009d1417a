#!/usr/bin/env bash
# The flow benchmark (docs/explanation/performance.md#the-benchmark) for a fresh machine. Run from anywhere:
#   bash scripts/bench.sh [python -m bench args...]     (--help lists them)
# Creates .venv if missing, installs the project with its bench extra
# (BullMQ's Python client, for the side-by-side rows, and pyinstrument), makes
# sure redis-server is on PATH, then runs the benchmark. It starts its own
# redis-server on a free loopback port (never 6379) unless --redis-url is given.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

EXTRAS="[bench]" NEED_REDIS=1 source scripts/setup.sh

exec .venv/bin/python -m bench "$@"
