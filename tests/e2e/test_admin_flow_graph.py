"""The flow graph in a browser (docs/howto/operate.md#the-flow-graph): a
3-level, 40-node flow at 1280 and 1920 px shows each node in its state's
colour, links every node to its page, marks and unfolds the failing path,
draws the children's bar and the timeline, and scrolls no page sideways;
no console errors (the ``admin`` fixture checks).

The flow: ``order-2026-12-000042`` with three middles of twelve leaves:
``m0``'s all completed (so ``m0`` completed), ``m1``'s first leaf dead (so
``m1`` died and failed the root), ``m2``'s still running.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from echomq_django import Flow, conf
from echomq_django.admin.pages import job_url
from echomq_django.monitoring.mirror import mirror_queues
from tests.support.workerkit import Clock

pytestmark = pytest.mark.e2e

WIDTHS = (1280, 1920)
QUEUE = "fulfilment-graph"
ROOT = "order-2026-12-000042"
MIDDLES = [f"{ROOT}-part-m{i}" for i in range(3)]
COLOURS = {  # the state colours of admin.css, as the browser computes them
    "completed": "rgb(46, 125, 50)",
    "dead": "rgb(198, 40, 40)",
    "active": "rgb(163, 95, 0)",
    "awaiting_children": "rgb(77, 122, 140)",
}


def leaf_id(m: int, j: int) -> str:
    return f"{ROOT}-part-m{m}-line-{j:02d}"


@pytest.fixture
def graph(r):
    conf.reset()
    mq = conf.get_mq()
    mq.clock = Clock()
    mq.add_flow(
        Flow(
            QUEUE,
            "shop.fulfil_order",
            {},
            job_id=ROOT,
            children=[
                Flow(
                    QUEUE,
                    "shop.pack_part",
                    {},
                    job_id=MIDDLES[m],
                    children=[
                        Flow(QUEUE, "shop.pick_line", {"line": j}, job_id=leaf_id(m, j))
                        for j in range(12)
                    ],
                )
                for m in range(3)
            ],
        )
    )
    mq.clock.advance(2000)
    for job in mq.claim(QUEUE, 100):  # the 36 leaves
        mq.clock.advance(100)
        if job.id == leaf_id(1, 0):
            mq.fail(job, "OutOfStock: line 0 of part m1", dead=True)
        elif not job.id.startswith(MIDDLES[2]):
            mq.complete(job, {"picked": True})
    mq.clock.advance(1000)
    (m0,) = mq.claim(QUEUE, 1)
    assert m0.id == MIDDLES[0]
    mq.clock.advance(300)
    mq.complete(m0, {"packed": 12})
    mirror_queues(mq, [QUEUE], full=True)
    yield mq
    conf.reset()


def expected_states() -> dict[str, str]:
    states = {MIDDLES[0]: "completed", MIDDLES[1]: "dead", MIDDLES[2]: "awaiting_children"}
    for j in range(12):
        states[leaf_id(0, j)] = "completed"
        states[leaf_id(1, j)] = "dead" if j == 0 else "completed"
        states[leaf_id(2, j)] = "active"
    return states


@pytest.mark.parametrize("width", WIDTHS)
def test_the_flow_graph_draws_states_links_and_the_failing_path(admin, graph, width):
    admin.page.set_viewport_size({"width": width, "height": 900})
    page = admin.visit(job_url(QUEUE, ROOT))
    states = expected_states()
    nodes = page.locator("#emq-tree li.emq-node")
    expect(nodes).to_have_count(39)
    seen = page.evaluate(
        """() => [...document.querySelectorAll('#emq-tree li.emq-node')].map(li => [
            li.dataset.job,
            li.dataset.state,
            getComputedStyle(li).borderLeftColor,
            li.querySelector('a').getAttribute('href'),
            li.classList.contains('emq-failing'),
        ])"""
    )
    assert sorted(seen) == sorted(
        [
            f"{QUEUE}/{job_id}",
            state,
            COLOURS[state],
            job_url(QUEUE, job_id),
            job_id in (MIDDLES[1], leaf_id(1, 0)),
        ]
        for job_id, state in states.items()
    )
    # the failing path is unfolded; the other parents are folded
    failing = page.locator(f'li[data-job="{QUEUE}/{leaf_id(1, 0)}"]')
    expect(failing).to_be_visible()
    expect(page.locator(f'li[data-job="{QUEUE}/{leaf_id(0, 0)}"]')).to_be_hidden()
    # a link opens the node's own page
    page.locator(f'li[data-job="{QUEUE}/{MIDDLES[1]}"] > details > summary a').click()
    expect(page.locator("#emq-state")).to_have_text("dead")
    page.go_back()
    # the children's bar: one completed, one failed the parent, one to finish
    parts = page.locator("#emq-statebar rect")
    expect(parts).to_have_count(3)
    assert [parts.nth(i).get_attribute("data-part") for i in range(3)] == [
        "processed",
        "failed",
        "unprocessed",
    ]
    expect(page.locator("#emq-statebar figcaption")).to_contain_text("failed the parent: 1 (33%)")
    # the timeline: the root and its 39 nodes, each a row with its waits in words
    rows = page.locator("#emq-timeline tbody tr")
    expect(rows).to_have_count(40)
    expect(
        page.locator(f'#emq-timeline tr[data-job="{QUEUE}/{MIDDLES[0]}"] td').nth(2)
    ).to_have_text("6.6 s")
    admin.shot(f"flow-graph-{width}")
    doc = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert doc[0] <= doc[1], f"the page scrolls sideways: {doc}"
    for box in ("#emq-tree", "#emq-statebar", "#emq-timeline"):
        sizes = page.evaluate(
            f"(e => [e.scrollWidth, e.clientWidth])(document.querySelector('{box}'))"
        )
        assert sizes[0] <= sizes[1], f"{box} scrolls sideways: {sizes}"
