"""The schedules page in a browser (docs/howto/periodic.md#the-admin-page)
at 1280 and 1920 px: the settings' entry marked read-only with no pause,
a run-time entry paused and resumed with its buttons, an edit saved, and
no page that scrolls sideways; no console errors (the ``admin`` fixture
checks)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

import echomq_django as emq
from echomq_django import conf
from tests.support.workerapp import jobs as _handlers  # noqa: F401  (t.echo)

pytestmark = pytest.mark.e2e

URL = "/admin/echomq_django/periodicentry/"


@pytest.fixture
def entries(r, settings):
    settings.ECHOMQ = {
        **settings.ECHOMQ,
        "SCHEDULE": {
            "nightly-invoice-reminders": {
                "name": "t.echo",
                "queue": "billing-notifications",
                "cron": "0 3 * * *",
            }
        },
    }
    conf.reset()
    emq.schedules.upsert(
        "follow-customer-2026-12-000042",
        handler="t.echo",
        queue="crm-follow-ups",
        every_s=3600,
        payload={"customer": "2026-12-000042", "channel": "email"},
    )
    yield conf.get_mq()
    conf.reset()


def no_sideways_scroll(page) -> None:
    doc = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert doc[0] <= doc[1], f"the page scrolls sideways: {doc}"


@pytest.mark.parametrize("width", (1280, 1920))
def test_pause_resume_and_edit_in_the_browser(admin, entries, width):
    admin.page.set_viewport_size({"width": width, "height": 900})
    page = admin.visit(URL)
    fixed = page.locator('tr[data-entry="nightly-invoice-reminders"]')
    expect(fixed.locator(".emq-badge")).to_have_text("settings")
    expect(fixed.locator('button[value="pause"]')).to_have_count(0)
    row = page.locator('tr[data-entry="follow-customer-2026-12-000042"]')
    expect(row).to_have_attribute("data-paused", "no")
    no_sideways_scroll(page)
    row.locator('button[value="pause"]').click()
    expect(page.locator(".messagelist")).to_contain_text("Paused follow-customer-2026-12-000042.")
    expect(row).to_have_attribute("data-paused", "yes")
    assert emq.schedules.get("follow-customer-2026-12-000042")["paused"] is True
    row.locator('button[value="resume"]').click()
    expect(row).to_have_attribute("data-paused", "no")
    row.locator("th a").click()
    page.fill("#id_every_s", "")
    page.fill("#id_cron", "*/15 * * * *")
    no_sideways_scroll(page)
    page.locator("#emq-schedule-form input[type=submit]").click()
    expect(page.locator(".messagelist")).to_contain_text("Saved follow-customer-2026-12-000042.")
    expect(row.locator("td code").first).to_have_text("*/15 * * * *")
    no_sideways_scroll(page)
