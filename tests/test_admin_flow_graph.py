"""The flow page's pictures (docs/howto/operate.md#the-flow-graph), through
the Django test client on the private Redis with a fake clock: the tree's
states and failing path, the children's state bar, the timeline, and a
10,000-child parent drawn from one page's reads."""

from __future__ import annotations

import re

import pytest

from echomq_django import Flow, conf
from echomq_django.admin.flow_graph import TIMELINE_ROWS, state_summary
from echomq_django.admin.pages import job_url
from echomq_django.monitoring.mirror import mirror_queues
from tests.support.factories import StaffUserFactory
from tests.support.workerkit import Clock

pytestmark = pytest.mark.django_db


@pytest.fixture
def emq(r):
    """The settings' ``EchoMQ`` on the private server, on a fake clock."""
    conf.reset()
    mq = conf.get_mq()
    mq.clock = Clock()
    yield mq
    conf.reset()


@pytest.fixture
def staff(client):
    client.force_login(StaffUserFactory())
    return client


def run(mq, queue: str, job_id: str, result=None, error: str | None = None) -> None:
    """Wait 1 s, claim ``job_id`` (the head of ``queue``), run 0.5 s, then
    complete it or fail it dead."""
    mq.clock.advance(1000)
    [job] = mq.claim(queue, 1)
    assert job.id == job_id
    mq.clock.advance(500)
    if error is None:
        mq.complete(job, result)
    else:
        mq.fail(job, error, dead=True)


def leaf(job_id: str, **kw) -> Flow:
    return Flow("graph", "t.leaf", {}, job_id=job_id, **kw)


def page(client, queue: str, job_id: str):
    mirror_queues(conf.get_mq(), [queue])
    response = client.get(job_url(queue, job_id), follow=True)
    assert response.status_code == 200
    return response


def flat(nodes: list[dict]) -> list[tuple]:
    out = []
    for n in nodes:
        out.append((n["id"], n["state"], n["failing"], n["open"]))
        out += flat(n["children"])
    return out


def test_the_tree_marks_states_and_the_failing_path_and_the_timeline_shows_each_wait(emq, staff):
    emq.add_flow(
        Flow(
            "graph",
            "t.parent",
            {},
            job_id="g",
            children=[
                Flow("graph", "t.mid", {}, job_id="a", children=[leaf("a1"), leaf("a2")]),
                leaf("b"),
                Flow("graph", "t.mid", {}, job_id="c", children=[leaf("c1")]),
            ],
        )
    )
    # in the order they become claimable: b, a1, a2, then a (released by
    # a2, ahead of c1)
    run(emq, "graph", "b", 3)
    run(emq, "graph", "a1", 1)
    run(emq, "graph", "a2", 2)
    run(emq, "graph", "a", 3)
    run(emq, "graph", "c1", error="card <b>declined</b>")  # c dies, and g with it
    response = page(staff, "graph", "g")
    ctx = response.context
    assert ctx["live"].state == "dead"
    assert ctx["failing"] is True
    assert flat(ctx["tree"]) == [
        ("a", "completed", False, False),
        ("a1", "completed", False, False),
        ("a2", "completed", False, False),
        ("b", "completed", False, False),
        ("c", "dead", True, True),
        ("c1", "dead", True, False),
    ]
    html = response.content.decode()
    assert re.findall(r'<li class="([^"]+)" data-job="graph/(\w+)"', html) == [
        ("emq-node emq-node-completed", "a"),
        ("emq-node emq-node-completed", "a1"),
        ("emq-node emq-node-completed", "a2"),
        ("emq-node emq-node-completed", "b"),
        ("emq-node emq-node-dead emq-failing", "c"),
        ("emq-node emq-node-dead emq-failing", "c1"),
    ]
    assert '<details open><summary><span class="emq-node-line"><a href="' in html  # c unfolded
    for job_id in ("a", "a1", "c1"):
        assert f'<a href="{job_url("graph", job_id)}">graph/{job_id}</a>' in html
    # the bar: 3 children, 2 completed and 1 that failed g
    assert [(p["key"], p["n"], p["x"], p["width"]) for p in ctx["state_bar"]["parts"]] == [
        ("processed", 2, "0.0", "666.7"),
        ("failed", 1, "666.7", "333.3"),
    ]
    assert ctx["state_bar"]["label"] == "3 children: 2 completed, 1 failed the parent"
    assert 'data-part="failed" data-n="1"' in html
    # the timeline: g first, then depth first; times from the fake clock
    timeline = ctx["timeline"]
    assert [
        (r["id"], r["depth"], r["state"], r["waited_text"], r["ran_text"]) for r in timeline["rows"]
    ] == [
        ("g", 0, "dead", "7.5 s", "-"),  # never started: it waited until c failed it
        ("a", 1, "completed", "5.5 s", "0.5 s"),
        ("a1", 2, "completed", "2.5 s", "0.5 s"),
        ("a2", 2, "completed", "4.0 s", "0.5 s"),
        ("b", 1, "completed", "1.0 s", "0.5 s"),
        ("c", 1, "dead", "7.5 s", "-"),
        ("c1", 2, "dead", "7.0 s", "0.5 s"),
    ]
    assert (timeline["span"], timeline["more"]) == ("7.5 s", 0)
    rows = dict((r["id"], r) for r in timeline["rows"])
    assert rows["a1"]["waited"] == {"x": "0.0", "width": "333.3"}
    assert rows["a1"]["ran"] == {"x": "333.3", "width": "66.7"}
    assert rows["a"]["ran"] == {"x": "733.3", "width": "66.7"}
    assert '<tr data-job="graph/c1" data-state="dead">' in html


def test_a_huge_parent_is_summarised_by_state_and_drawn_from_one_page(emq, staff):
    emq.add_flow(
        Flow(
            "wide",
            "t.parent",
            {},
            job_id="w",
            children=[Flow("wide", "t.leaf", i, job_id=f"w{i}") for i in range(10_000)],
        )
    )
    for i in range(3):
        run(emq, "wide", f"w{i}", i)
    response = page(staff, "wide", "w")
    ctx = response.context
    assert ctx["pager"]["pages"] == 100
    assert len(ctx["tree"]) == 100
    assert [(p["key"], p["n"], p["percent"]) for p in ctx["state_bar"]["parts"]] == [
        ("processed", 3, "0"),
        ("unprocessed", 9997, "100"),
    ]
    assert len(ctx["timeline"]["rows"]) == TIMELINE_ROWS
    assert ctx["timeline"]["more"] == 101 - TIMELINE_ROWS  # the page's root and 100 children
    second = staff.get(response.request["PATH_INFO"] + "?page=2")
    assert [n["id"] for n in second.context["tree"]][:2] == ["w100", "w101"]


def test_a_parent_with_no_children_left_draws_no_bar():
    assert state_summary({"children": 0}) == {"total": 0, "label": "0 children: ", "parts": []}


def test_a_child_pruned_mid_render_is_drawn_as_gone(emq, staff):
    """Retention may prune a finished child between the parent's list read
    and its row read: the page still draws, that node as gone (no state),
    linking to its job page, which says the job is no longer in Redis."""
    emq.add_flow(Flow("graph", "t.parent", {}, job_id="g", children=[leaf("x"), leaf("y")]))
    run(emq, "graph", "x", 1)
    mirror_queues(conf.get_mq(), ["graph"])
    # what a prune between the two reads leaves: the list names x, its row is gone
    emq.client.delete(emq.keys.job("graph", "x"))
    response = page(staff, "graph", "g")
    assert flat(response.context["tree"]) == [
        ("x", None, False, False),
        ("y", "pending", False, False),
    ]
    html = response.content.decode()
    assert re.findall(r'<li class="([^"]+)" data-job="graph/(\w+)"', html) == [
        ("emq-node emq-node-gone", "x"),
        ("emq-node emq-node-pending", "y"),
    ]
    assert "no longer in Redis (removed or pruned since its parent named it)" in html
    assert f'<a href="{job_url("graph", "x")}">graph/x</a>' in html
    timeline = response.context["timeline"]  # no times to draw x by: counted, not drawn
    assert [(r["id"], r["state"]) for r in timeline["rows"]] == [
        ("g", "awaiting_children"),
        ("y", "pending"),
    ]
    assert timeline["more"] == 1
    # its own page: the mirror's copy, said to be gone from Redis
    response = staff.get(job_url("graph", "x"), follow=True)
    assert response.status_code == 200 and response.context["live"] is None
    assert "This job is not in Redis any more" in response.content.decode()


def test_a_parent_pruned_before_its_page_reads_it_shows_the_mirror_copy(emq, staff):
    emq.add_flow(Flow("graph", "t.parent", {}, job_id="g", children=[leaf("x")]))
    mirror_queues(conf.get_mq(), ["graph"])
    emq.client.delete(emq.keys.job("graph", "g"))  # pruned after the mirror copied it
    response = staff.get(job_url("graph", "g"), follow=True)
    assert response.status_code == 200
    assert (response.context["live"], response.context["is_parent"]) == (None, False)
    assert "This job is not in Redis any more" in response.content.decode()
