#!/usr/bin/env bash
# The flow benchmark (docs/explanation/performance.md#the-benchmark) for a fresh machine. Run from anywhere:
#   bash scripts/bench.sh [python -m bench args...]     (--help lists them)
# Creates .venv-bench if missing, installs the project with its bench extra
# (BullMQ's Python client, for the side-by-side rows, and pyinstrument), makes
# sure redis-server is on PATH, then runs the benchmark. It starts its own
# redis-server on a free loopback port (never 6379) unless --redis-url is given.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A venv of its own: BullMQ's Python client pins croniter 2.0.7, which the
# test and cron extras refuse (pyproject.toml), so it stays out of .venv.
VENV=.venv-bench EXTRAS="[bench]" NEED_REDIS=1 source scripts/setup.sh

# BullMQ for Node, for the wait scenario's side-by-side rows (job.waitUntilFinished
# exists only there); without node/npm that scenario runs ours alone.
if command -v npm >/dev/null 2>&1 && [ ! -d bench/node/node_modules/bullmq ]; then
  npm install --prefix bench/node --no-audit --no-fund --silent \
    || echo "bench: BullMQ for Node did not install; the wait scenario runs ours alone" >&2
fi

exec .venv-bench/bin/python -m bench "$@"
