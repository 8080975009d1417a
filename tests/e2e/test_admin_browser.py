"""The admin in a real browser: headless Debian chromium, 1400 px wide,
driven by Playwright. Each test asserts what an operator sees, and
the ``admin`` fixture fails it if any page logged a console error.

The world: queue ``shop`` holds flow ``order-1`` (awaiting children:
``pick`` completed with a value, ``gift`` dead with a traceback but ignored
by policy, ``pack`` pending) and flow ``order-2`` (dead: its child
``charge`` died and failed it).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from echomq_django import Flow, conf
from echomq_django.admin.pages import job_url
from echomq_django.monitoring.mirror import mirror_queues
from echomq_django.runners.heartbeat import Heartbeat
from tests.support.workerkit import Clock

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


def row_of(page, job_id: str):
    """The job list's row of ``job_id`` (the id in its first cell, exactly)."""
    cell = page.locator("td.field-job .emq-job-id", has_text=re.compile(f"^{re.escape(job_id)}$"))
    return page.locator("#result_list tbody tr").filter(has=cell)


def test_the_job_list_reads_right(admin, shop):
    page = admin.visit("/admin/echomq_django/mirroredjob/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(6)
    charge = row_of(page, "charge")
    expect(charge.locator(".field-state_badge .emq-badge")).to_have_text("dead")
    expect(charge.locator(".field-state_badge .emq-badge")).to_have_css(
        "background-color", "rgb(198, 40, 40)"
    )
    expect(charge.locator(".field-error_preview")).to_have_text(
        "CardDeclined: card ending 0000 was declined"
    )
    expect(charge.locator(".field-state_badge .emq-attempts")).to_have_text("1 of 3 attempts")
    expect(charge.locator(".field-job .emq-sub")).to_have_text("shop · shop.charge")
    expect(charge.locator(".field-times")).to_have_text("1.5\u00a0s · 0.0\u00a0s")
    pick = row_of(page, "pick")
    expect(pick.locator(".field-times")).to_have_text("0.0\u00a0s · 1.5\u00a0s")
    expect(pick.locator(".field-parent_link a")).to_have_text("shop/order-1")
    # the whole list fits the page: no sideways scrolling at 1400 px
    # (test_admin_widths.py holds it to 1280 px with long ids and errors)
    assert page.evaluate(
        "(e => e.scrollWidth <= e.clientWidth)(document.querySelector('.results'))"
    )
    # no red cross on healthy rows: booleans are words
    expect(page.locator("#result_list img[alt='False']")).to_have_count(0)
    # the buttons look like Django's object tools
    refresh = page.get_by_role("button", name="Refresh from Redis")
    expect(refresh).to_have_css("text-transform", "uppercase")
    expect(refresh).to_have_css("border-radius", "15px")
    admin.shot("job-list")
    page.get_by_role("link", name="with an error").click()
    expect(rows).to_have_count(4)  # gift, pack (a retry is due), charge, order-2


def test_queue_counts_open_the_filtered_list(admin, shop):
    page = admin.visit("/admin/echomq_django/mirroredqueue/")
    row = page.locator("#result_list tbody tr").filter(has_text="shop")
    expect(row.locator(".field-dead_count")).to_have_text("3")
    row.locator(".field-dead_count a").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(3)
    expect(page.locator("#result_list .field-state_badge .emq-badge")).to_have_text(
        ["dead", "dead", "dead"]
    )


def test_the_workers_page_lists_live_processes(admin, shop):
    page = admin.visit("/admin/echomq_django/mirroredqueue/workers/")
    expect(page.locator("#emq-no-workers")).to_contain_text("No worker or pump is running")
    worker = Heartbeat(
        shop,
        "worker",
        ["shop"],
        interval_s=5,
        concurrency=8,
        status=lambda: {"jobs_done": 41, "running": 1, "running_jobs": ["shop/pack"]},
    )
    worker.beat()
    Heartbeat(shop, "pump", ["shop"], interval_s=5).beat()
    shop.clock.advance(2000)
    page = admin.visit("/admin/echomq_django/mirroredqueue/")
    page.get_by_role("link", name="Live workers").click()
    rows = page.locator("#emq-workers tbody tr")
    expect(rows).to_have_count(2)
    first = rows.nth(0)
    expect(first.locator(".emq-badge")).to_have_text("pump")
    w = rows.nth(1)
    expect(w).to_contain_text(str(worker.info.pid))
    expect(w.locator("td").nth(6)).to_have_text("41")
    expect(w.locator(".emq-running")).to_have_text("1: shop/pack")
    expect(w.locator("td").nth(9)).to_have_text("2.0 s ago")
    admin.shot("workers")
    w.get_by_role("link", name="shop/pack").click()
    expect(page.locator("#emq-state .emq-badge")).to_have_text("delayed")


def test_a_flow_page_shows_the_tree_and_folds_the_traceback(admin, shop):
    page = admin.visit(job_url("shop", "order-1"))
    state = page.locator("#emq-state .emq-badge")
    expect(state).to_have_text("awaiting children")
    expect(state).to_have_class("emq-badge emq-state-awaiting_children")
    expect(page.locator("#emq-remaining")).to_have_text("1")
    nodes = page.locator("#emq-tree .emq-node")
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


def test_a_nested_flow_folds_and_a_big_fan_in_pages(admin, shop):
    kids = [Flow("shop", "shop.item", {"n": i}, job_id=f"item-{i}") for i in range(250)]
    shop.add_flow(
        Flow(
            "shop",
            "shop.batch",
            {},
            job_id="batch",
            children=[Flow("shop", "shop.box", {}, job_id="box", children=kids[:3]), *kids[3:]],
        )
    )
    page = admin.visit(job_url("shop", "batch"))
    tree = page.locator("#emq-tree > ul > li")
    expect(tree).to_have_count(100)
    expect(page.locator(".emq-pager").first).to_have_text(
        "Children 1-100 of 248 · page 1 of 3 · next \u203a"
    )
    box = tree.filter(has_text="shop/box").first
    inner = box.locator("details > ul > li")
    expect(inner).to_have_count(3)
    expect(inner.first).to_be_hidden()  # folded
    box.locator("summary").first.click()
    expect(inner.first).to_be_visible()
    page.locator(".emq-next").first.click()
    expect(page.locator(".emq-pager").first).to_have_text(
        "Children 101-200 of 248 · page 2 of 3 · \u2039 previous · next \u203a"
    )
    expect(tree).to_have_count(100)


def test_retry_by_id_brings_a_dead_job_back(admin, shop):
    page = admin.visit(job_url("shop", "charge"))
    expect(page.locator("#emq-state .emq-badge")).to_have_text("dead")
    page.get_by_role("button", name="Retry by id…").click()
    expect(page.locator("#emq-retry-targets tbody td")).to_have_text(["shop", "charge", "dead"])
    page.get_by_role("button", name="Yes, retry").click()
    expect(page.locator(".messagelist")).to_contain_text("Retried shop/charge: now pending")
    expect(page.locator("#emq-state .emq-badge")).to_have_text("pending")
    expect(page.locator("#emq-parent")).to_contain_text("shop/order-2")
