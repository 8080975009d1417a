"""The browser rig: Playwright (``pytest-playwright``) driving Debian's
``chromium`` against pytest-django's ``live_server`` (issue 15).

A browser test module imports the fixtures it uses from here::

    from tests.browserkit import admin, browser_type_launch_args  # noqa: F401

* ``browser_type_launch_args`` points pytest-playwright at ``CHROMIUM``
  (Playwright's own browser download is never used; ``scripts/test.sh``
  installs the Debian package where it is missing);
* ``admin``: an ``AdminBrowser`` whose page is logged in as a superuser of
  the test database and records every console error and page error;
  ``admin.visit(path)`` opens a page (asserting HTTP 200) and the fixture
  fails the test if any page logged an error.

Set ``ECHOMQ_SCREENSHOTS=DIR`` to have ``admin.shot(name)`` write full-page
PNGs there (the README's screenshots come from this; nothing is committed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# Playwright's sync API keeps an asyncio loop in the test thread for the whole
# session, and Django refuses ORM calls from a thread with a loop: the test
# database's set-up and the tests' own ORM calls are plain synchronous code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("ECHOMQ_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1400, "height": 900}  # the "1400 px wide"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        pytest.fail(
            f"no chromium at {CHROMIUM}: run `bash scripts/test.sh` (it installs Debian's "
            "chromium with apt-get), or set ECHOMQ_CHROMIUM to a Chromium binary",
            pytrace=False,
        )
    return {**browser_type_launch_args, "executable_path": CHROMIUM}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": VIEWPORT}


class AdminBrowser:
    """A logged-in page on the live server, with the console errors it saw."""

    def __init__(self, page, base_url: str) -> None:
        self.page, self.base_url = page, base_url
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"{page.url}: {exc}"))

    def _console(self, msg) -> None:
        # the browser's own favicon request is not the page's (Django's admin names none)
        if msg.type == "error" and not msg.location.get("url", "").endswith("/favicon.ico"):
            self.errors.append(f"{self.page.url}: {msg.text} ({msg.location.get('url')})")

    def visit(self, path: str):
        """Open ``path`` (under the live server); asserts it answered 200."""
        response = self.page.goto(self.base_url + path)
        assert response is not None and response.status == 200, (path, response and response.status)
        return self.page

    def shot(self, name: str) -> None:
        """A full-page PNG ``name.png`` in ``$ECHOMQ_SCREENSHOTS`` (when set)."""
        folder = os.environ.get("ECHOMQ_SCREENSHOTS")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


@pytest.fixture
def admin(page, live_server, transactional_db, django_user_model):
    from django.test import Client

    user = django_user_model.objects.create_superuser("operator", "op@example.com", None)
    client = Client()
    client.force_login(user)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    browser = AdminBrowser(page, live_server.url)
    yield browser
    assert browser.errors == [], f"pages logged errors in the browser console: {browser.errors}"
