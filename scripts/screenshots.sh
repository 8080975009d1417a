#!/usr/bin/env bash
# The README's admin screenshots, made fresh (nothing is committed):
#   bash scripts/screenshots.sh [DIR]      (default docs/screenshots)
# Sets up .venv and Debian's chromium like scripts/test.sh, then runs the
# admin's browser tests with ECHOMQ_SCREENSHOTS=DIR: each writes a full-page
# PNG of what it checked (job-list.png, flow-page.png, workers.png, and
# job-list-1280.png ... at 1280 and 1400 px).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR="${1:-docs/screenshots}"

EXTRAS="[test]" NEED_REDIS=1 NEED_CHROMIUM=1 source scripts/setup.sh

ECHOMQ_SCREENSHOTS="$DIR" .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/e2e/test_admin_browser.py tests/e2e/test_admin_widths.py
echo "== screenshots in $DIR:"
ls -1 "$DIR"
