"""The admin's lists fit a laptop screen: at 1280 and 1400 px wide, with
the navigation sidebar and the filters open, realistic ids (``invoice-
2026-11-000123-retry``), long job names and multi-line errors, neither
list scrolls sideways and every column header is on screen.

The world: queue ``billing-invoices`` holds flow ``month-close-2026-11-
batch-000042`` (dead: one invoice failed it) whose children carry long ids,
tracebacks, and a first line with a long unbroken token (a URL); queue
``billing-reminders`` holds a few pending jobs.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from echomq_django import Flow, conf
from echomq_django.admin.pages import job_url
from echomq_django.monitoring.mirror import mirror_queues
from tests.support.workerkit import Clock

pytestmark = pytest.mark.e2e

WIDTHS = (1280, 1400)
QUEUE = "billing-invoices"
PARENT = "month-close-2026-11-batch-000042"
IDS = [f"invoice-2026-11-{n:06d}-retry" for n in (123, 124, 125, 126)]
TRACEBACK = (
    "psycopg.errors.SerializationFailure: could not serialize access due to concurrent "
    "update while rendering invoice-2026-11-000123-retry for customer cus_Q4xk81LmPz0aRt "
    "(https://billing.example.com/api/v2/customers/cus_Q4xk81LmPz0aRt/invoices/"
    "invoice-2026-11-000123-retry/render?format=pdf&locale=en-GB)\n"
    "Traceback (most recent call last):\n"
    '  File "/srv/app/billing/tasks/render_invoice_pdf.py", line 212, in render_invoice_pdf\n'
    "    document = renderer.render(invoice, template=customer.invoice_template_name)\n"
    "psycopg.errors.SerializationFailure: could not serialize access due to concurrent update"
)


@pytest.fixture
def billing(r):
    conf.reset()
    mq = conf.get_mq()
    mq.clock = Clock()
    mq.add_flow(
        Flow(
            QUEUE,
            "billing.tasks.close_month_and_send_statements",
            {"month": "2026-11"},
            job_id=PARENT,
            children=[
                Flow(QUEUE, "billing.tasks.render_invoice_pdf", {"n": i}, job_id=job_id)
                for i, job_id in enumerate(IDS)
            ],
        )
    )
    first, second, third = mq.claim(QUEUE, 3)
    mq.clock.advance(83_000)
    mq.complete(first, {"pages": 3, "bytes": 48213})
    mq.fail(second, "TimeoutError: the PDF renderer did not answer in 30 s")
    mq.fail(third, TRACEBACK, dead=True)
    for n in range(3):
        mq.enqueue(
            "billing-reminders",
            "billing.tasks.send_payment_reminder_email",
            {"n": n},
            job_id=f"reminder-2026-11-cus_Q4xk81LmPz0aRt-{n:04d}",
        )
    mirror_queues(mq, [QUEUE, "billing-reminders"], full=True)
    yield mq
    conf.reset()


def assert_fits(page) -> None:
    """The results table's box does not scroll sideways, the page does not
    either, and every column header lies inside the viewport."""
    box = page.evaluate(
        "(e => [e.scrollWidth, e.clientWidth])(document.querySelector('#changelist .results'))"
    )
    assert box[0] <= box[1], f"the results box scrolls sideways: {box}"
    doc = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert doc[0] <= doc[1], f"the page scrolls sideways: {doc}"
    width = page.viewport_size["width"]
    headers = page.locator("#result_list thead th")
    for i in range(headers.count()):
        th = headers.nth(i)
        rect = th.bounding_box()
        name = th.inner_text().strip() or th.get_attribute("class")
        assert rect is not None and rect["x"] >= 0, name
        assert rect["x"] + rect["width"] <= width, f"{name!r} is cut at {width} px: {rect}"


@pytest.mark.parametrize("width", WIDTHS)
def test_the_job_list_fits(admin, billing, width):
    admin.page.set_viewport_size({"width": width, "height": 900})
    page = admin.visit("/admin/echomq_django/mirroredjob/")
    assert page.locator("#result_list tbody tr").count() == 8
    admin.shot(f"job-list-{width}")
    assert_fits(page)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_queue_list_fits(admin, billing, width):
    admin.page.set_viewport_size({"width": width, "height": 900})
    page = admin.visit("/admin/echomq_django/mirroredqueue/")
    admin.shot(f"queue-list-{width}")
    assert_fits(page)


def assert_page_fits(page) -> None:
    doc = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert doc[0] <= doc[1], f"the page scrolls sideways: {doc}"


@pytest.mark.parametrize("width", WIDTHS)
def test_the_job_and_queue_pages_fit(admin, billing, width):
    admin.page.set_viewport_size({"width": width, "height": 900})
    page = admin.visit(job_url(QUEUE, PARENT))
    expect(page.locator("#emq-remaining")).to_have_text("2")  # one delayed, one pending
    page.locator("#emq-tree details.emq-traceback summary").first.click()
    admin.shot(f"flow-page-{width}")
    assert_page_fits(page)
    page = admin.visit(job_url(QUEUE, IDS[2]))
    expect(page.locator("#emq-attempts")).to_have_text("1 of 3")
    admin.shot(f"job-page-{width}")
    assert_page_fits(page)
    page = admin.visit(f"/admin/echomq_django/mirroredqueue/{QUEUE}/change/")
    admin.shot(f"queue-page-{width}")
    assert_page_fits(page)


def test_with_redis_down_the_pages_say_so_and_show_the_mirror(admin, billing, monkeypatch):
    monkeypatch.setenv("ECHOMQ_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    conf.reset()
    admin.page.set_viewport_size({"width": 1280, "height": 900})
    page = admin.visit(job_url(QUEUE, IDS[2]))
    expect(page.locator("#emq-redis-error")).to_contain_text("Could not read Redis: ")
    expect(page.locator("#emq-source")).to_contain_text(" (mirror)")
    expect(page.locator("#emq-attempts")).to_have_text("1 of 3")
    admin.shot("job-page-redis-down")
    assert_page_fits(page)
    page = admin.visit("/admin/echomq_django/mirroredqueue/workers/")
    expect(page.locator("#content-main")).to_have_text(
        re.compile(r"^\s*Could not read Redis: [^\n]+\s*$")
    )
    admin.shot("workers-redis-down")
