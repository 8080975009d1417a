"""The browser rig: Playwright (``pytest-playwright``) driving Debian's
``chromium`` against pytest-django's ``live_server``.

Its fixtures reach every test module through ``tests/conftest.py``'s
``pytest_plugins`` (this file imports neither Playwright nor the library
until a fixture runs):

* ``chromium``: Playwright driving ``CHROMIUM`` for the module
  (Playwright's own browser download is never used; ``scripts/test.sh``
  installs the Debian package where it is missing);
* ``admin``: an ``AdminBrowser`` whose page is logged in as a superuser of
  the test database and records every console error and page error;
  ``admin.visit(path)`` opens a page (asserting HTTP 200) and the fixture
  fails the test if any page logged an error.

Set ``ECHOMQ_SCREENSHOTS=DIR`` to have ``admin.shot(name)`` write full-page
PNGs there (scripts/screenshots.sh makes the docs' screenshots with it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ECHOMQ_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1400, "height": 900}  # the "1400 px wide"


@pytest.fixture(scope="module")
def chromium(pytestconfig):
    """Debian's chromium under Playwright, for one test module.

    Playwright's sync API runs an asyncio loop in the test thread while it is
    started. It is started and stopped here, per module (not per session, as
    pytest-playwright's own fixtures would), so tests after this module see
    no loop (``async_to_sync`` refuses a thread with one); while it runs,
    Django is told the ORM calls of the tests and the test database's set-up
    are synchronous code all the same. ``--headed`` (pytest-playwright's
    option) shows the browser."""
    from playwright.sync_api import sync_playwright

    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        pytest.fail(
            f"no chromium at {CHROMIUM}: run `bash scripts/test.sh` (it installs Debian's "
            "chromium with apt-get), or set ECHOMQ_CHROMIUM to a Chromium binary",
            pytrace=False,
        )
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    driver = sync_playwright().start()
    try:
        headed = bool(pytestconfig.getoption("headed", False))
        browser = driver.chromium.launch(executable_path=CHROMIUM, headless=not headed)
        yield browser
        browser.close()
    finally:
        driver.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


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

    def shot(self, name: str, full_page: bool = True) -> None:
        """A PNG ``name.png`` in ``$ECHOMQ_SCREENSHOTS`` (when set): the
        whole page, or what the viewport shows (``full_page`` False)."""
        folder = os.environ.get("ECHOMQ_SCREENSHOTS")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=full_page)


@pytest.fixture
def admin(chromium, live_server, transactional_db, django_user_model):
    from django.test import Client

    context = chromium.new_context(viewport=VIEWPORT)
    page = context.new_page()
    user = django_user_model.objects.create_superuser("operator", "op@example.com", None)
    client = Client()
    client.force_login(user)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    browser = AdminBrowser(page, live_server.url)
    yield browser
    context.close()
    assert browser.errors == [], f"pages logged errors in the browser console: {browser.errors}"
