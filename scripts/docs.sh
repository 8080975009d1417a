#!/usr/bin/env bash
# The docs site, built for a fresh machine. Run from anywhere:
#   bash scripts/docs.sh [sphinx-build args...]
# Creates .venv-docs if missing, installs the project with its docs extra
# (Sphinx, MyST-Parser, furo) into it, then builds the HTML site into
# docs/_build/html with warnings as errors (-W --keep-going: every warning is
# listed, then the build fails). autodoc imports the package with
# testproject's settings (docs/conf.py); no Redis is needed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv-docs EXTRAS="[docs]" NEED_REDIS=0 source scripts/setup.sh

echo "== building the docs site (warnings are errors)"
exec .venv-docs/bin/sphinx-build -W --keep-going -b html docs docs/_build/html "$@"
