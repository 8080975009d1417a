"""The admin in a real browser: headless Debian chromium, 1400 px wide,
driven by Playwright (issue 15). Each test asserts what an operator sees, and
the ``admin`` fixture fails it if any page logged a console error.

The world: queue ``shop`` holds flow ``order-1`` (awaiting children:
``pick`` completed with a value, ``gift`` dead with a traceback but ignored
by policy, ``pack`` pending) and flow ``order-2`` (dead: its child
``charge`` died and failed it).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from echomq_django import Flow, conf
from echomq_django.admin_pages import job_url
from echomq_django.mirror import mirror_queues
from tests import browserkit
from tests.workerkit import Clock

# fixtures (tests/browserkit.py)
admin = browserkit.admin
browser_type_launch_args = browserkit.browser_type_launch_args
browser_context_args = browserkit.browser_context_args

pytestmark = pytest.mark.e2e

TRACEBACK = (
    "ValueError: no such sku 'GIFT-9'\n"
    "Traceback (most recent call last):\n"
    '  File "shop/jobs.py", line 12, in wrap\n'
    "    sku = catalogue[payload['sku']]\n"
    "ValueError: no such sku 'GIFT-9'"
)


@pytest.fixture
def shop(r):
    conf.reset()
    mq = conf.get_mq()
    mq.clock = Clock()
    mq.add_flow(
        Flow(
            "shop",
            "shop.order",
            {"order": 1},
            job_id="order-1",
            children=[
                Flow("shop", "shop.pick", {"sku": "BOOK-1"}, job_id="pick"),
                Flow(
                    "shop",
                    "shop.gift",
                    {"sku": "GIFT-9"},
                    job_id="gift",
                    ignore_dependency_on_failure=True,
                ),
                Flow("shop", "shop.pack", {}, job_id="pack"),
            ],
        )
    )
    mq.add_flow(
        Flow(
            "shop",
            "shop.order",
            {"order": 2},
            job_id="order-2",
            children=[Flow("shop", "shop.charge", {"card": "0000"}, job_id="charge")],
        )
    )
    pick, gift = mq.claim("shop", 2)
    mq.clock.advance(1500)
    mq.complete(pick, {"picked": 1})
    mq.fail(gift, TRACEBACK, dead=True)
    [pack] = mq.claim("shop", 1)
    mq.fail(pack, "try again")  # back to pending (attempts remain)
    [charge] = mq.claim("shop", 1)
    assert charge.id == "charge"
    mq.fail(charge, "CardDeclined: card ending 0000 was declined", dead=True)
    mirror_queues(mq, ["shop"], full=True)
    yield mq
    conf.reset()


def test_the_job_list_shows_every_job(admin, shop):
    page = admin.visit("/admin/echomq_django/mirroredjob/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(6)
    expect(page.locator("#result_list")).to_contain_text("order-1")
    expect(page.locator("#result_list")).to_contain_text("charge")
    admin.shot("job-list")


def test_a_flow_page_shows_the_tree_and_folds_the_traceback(admin, shop):
    page = admin.visit(job_url("shop", "order-1"))
    state = page.locator("#emq-state .emq-badge")
    expect(state).to_have_text("awaiting children")
    expect(state).to_have_class("emq-badge emq-state-awaiting_children")
    expect(page.locator("#emq-remaining")).to_have_text("1")
    nodes = page.locator(".emq-tree .emq-node")
    expect(nodes).to_have_count(3)
    gift = nodes.filter(has_text="shop/gift")
    expect(gift.locator(".emq-badge")).to_have_text("dead")
    expect(gift.locator(".emq-policy")).to_have_text("on failure: ignore (the parent goes on)")
    # the traceback is folded to its first line; unfolding shows the line that raised
    fold = gift.locator("details.emq-traceback")
    expect(fold.locator("summary .emq-error-head")).to_have_text("ValueError: no such sku 'GIFT-9'")
    expect(fold.locator("pre")).to_be_hidden()
    fold.locator("summary").click()
    expect(fold.locator("pre")).to_be_visible()
    expect(fold.locator("pre")).to_contain_text("sku = catalogue[payload['sku']]")
    admin.shot("flow-page")


def test_retry_by_id_brings_a_dead_job_back(admin, shop):
    page = admin.visit(job_url("shop", "charge"))
    expect(page.locator("#emq-state .emq-badge")).to_have_text("dead")
    page.get_by_role("button", name="Retry by id…").click()
    expect(page.locator("#emq-retry-targets tbody td")).to_have_text(["shop", "charge", "dead"])
    page.get_by_role("button", name="Yes, retry").click()
    expect(page.locator(".messagelist")).to_contain_text("Retried shop/charge: now pending")
    expect(page.locator("#emq-state .emq-badge")).to_have_text("pending")
    expect(page.locator("#emq-parent")).to_contain_text("shop/order-2")
