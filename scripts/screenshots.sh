#!/usr/bin/env bash
# The docs' admin screenshots, made fresh from the browser tests:
#   bash scripts/screenshots.sh [DIR]      (default docs/_static/screenshots)
# Sets up .venv and Debian's chromium like scripts/test.sh, then runs the
# browser tests whose pictures the docs show with ECHOMQ_SCREENSHOTS=DIR:
# each writes a full-page PNG of what it checked (job-list.png, workers.png,
# flow-page.png; dashboard-light.png, dashboard-dark.png, flow-graph-light.png,
# flow-graph-dark.png). Commit what changed in docs/_static/screenshots:
# tests/test_screenshots.py checks the docs show exactly those.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR="${1:-docs/_static/screenshots}"

EXTRAS="[test]" NEED_REDIS=1 NEED_CHROMIUM=1 source scripts/setup.sh

ECHOMQ_SCREENSHOTS="$DIR" .venv/bin/python -m pytest -q -p no:cacheprovider -p no:randomly \
    tests/e2e/test_admin_browser.py tests/e2e/test_admin_themes.py
echo "== screenshots in $DIR:"
ls -1 "$DIR"
