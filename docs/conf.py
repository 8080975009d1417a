"""Sphinx configuration of the docs site (built by scripts/docs.sh).

Four rooms, each a folder of Markdown pages read by MyST: tutorial/,
howto/, reference/ and explanation/ (docs/index.md globs them). autodoc
imports the package with testproject's settings, so Django is set up here;
nothing is read from Redis at import time (docs/explanation/house.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django.setup()

from importlib.metadata import version as _version  # noqa: E402

project = "echomq-django"
author = "echomq-django contributors"
copyright = "echomq-django contributors"
release = _version("echomq-django")
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"

# Pages live in the four rooms. A Markdown file left at the top of docs/
# (a page not moved into a room yet) is not part of the site: only index.md
# is read there.
exclude_patterns = [
    "_build",
    "screenshots",
    *sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md"),
]

# `page.md#a-heading` links resolve to the heading's slug, as on GitHub.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# redis' and Django's own classes are not documented here
nitpicky = False

html_theme = "furo"
html_title = f"echomq-django {release}"
html_static_path = ["_static"]
html_css_files = ["tables.css"]
