"""The dashboard in a browser (docs/howto/operate.md#the-dashboard) at 1280
and 1920 px: a chart per queue with the right totals for a known
workload, a table twin, a refresh from the JSON endpoint that shows new
work without a reload, and no page that scrolls sideways; no console
errors (the ``admin`` fixture checks)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from echomq_django import conf

pytestmark = pytest.mark.e2e

WIDTHS = (1280, 1920)
URL = "/admin/echomq_django/mirroredqueue/dashboard/"


@pytest.fixture
def workload(r):
    """notifications-outbound-email: 6 added, 3 completed, 1 dead."""
    conf.reset()
    mq = conf.get_mq()
    for i in range(6):
        mq.enqueue("notifications-outbound-email", "mail.send_receipt", {"n": i})
    jobs = mq.claim("notifications-outbound-email", 4)
    for job in jobs[:3]:
        mq.complete(job, {"sent": True})
    mq.fail(jobs[3], "SMTPRecipientsRefused: 550 no such user", dead=True)
    yield mq
    conf.reset()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_dashboard_draws_the_known_workload_and_refreshes(admin, workload, width):
    admin.page.set_viewport_size({"width": width, "height": 900})
    page = admin.visit(URL + "?queue=notifications-outbound-email")
    section = page.locator("#emq-queue-notifications-outbound-email")
    chart = section.locator("svg[role=img]")
    expect(chart).to_have_attribute(
        "aria-label",
        "notifications-outbound-email, last 60 minutes: 6 added, 3 completed, 0 failed, 1 dead",
    )
    expect(section.locator("td[data-n=pending]")).to_have_text("2")
    section.locator("details.emq-dash-table summary").click()
    table = section.locator("details.emq-dash-table tbody")
    expect(table).to_be_visible()  # the minutes with a count: one, or two across a minute
    sums = page.evaluate(
        "t => [2, 3, 4, 5].map(i => [...t.rows].reduce((n, r) => n + +r.cells[i].textContent, 0))",
        table.element_handle(),
    )
    assert sums == [6, 3, 0, 1]  # added, completed, failed, dead
    doc = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert doc[0] <= doc[1], f"the page scrolls sideways: {doc}"
    admin.shot(f"dashboard-{width}")
    # new work shows on the next refresh, without a reload
    workload.enqueue("notifications-outbound-email", "mail.send_receipt", {"n": 6})
    page.evaluate("document.getElementById('emq-dashboard').refreshNow()")
    expect(page.locator("#emq-queue-notifications-outbound-email svg[role=img]")).to_have_attribute(
        "aria-label",
        "notifications-outbound-email, last 60 minutes: 7 added, 3 completed, 0 failed, 1 dead",
    )
    expect(page.locator("#emq-updated")).to_contain_text("updated")
    expect(page.locator("#emq-queue-notifications-outbound-email td[data-n=pending]")).to_have_text(
        "3"
    )
