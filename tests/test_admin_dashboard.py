"""The dashboard (docs/howto/operate.md#the-dashboard) through the Django
test client on the private Redis: staff only, every queue's numbers and
chart from the per-minute counters, the JSON the page refreshes from, and
the bad input (an unknown queue, a range not kept, Redis down)."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from echomq_django import Flow, conf
from echomq_django.admin.dashboard import COLUMNS, chart
from echomq_django.protocol.probes import MINUTES_KEPT
from tests.support.factories import StaffUserFactory, UserFactory

pytestmark = pytest.mark.django_db

PAGE = "admin:echomq_django_mirroredqueue_dashboard"
JSON = "admin:echomq_django_mirroredqueue_dashboard_json"


@pytest.fixture
def emq(r):
    conf.reset()
    mq = conf.get_mq()
    yield mq
    conf.reset()


@pytest.fixture
def staff(client):
    client.force_login(StaffUserFactory())
    return client


@pytest.fixture
def work(emq):
    """mail: 4 added, 2 completed, 1 failed (retried), 1 dead;
    reports: a flow of 3 (one held parent, two leaves)."""
    for i in range(4):
        emq.enqueue("mail", "t.echo", i, job_id=f"m{i}")
    a, b, c = emq.claim("mail", 3)
    emq.complete(a, 1)
    emq.complete(b, 2)
    emq.fail(c, "smtp down")
    (c,) = emq.claim("mail", 1)
    emq.fail(c, "smtp down for good", dead=True)
    emq.add_flow(
        Flow(
            "reports",
            "t.sum",
            job_id="r",
            children=[Flow("reports", "t.echo", 1)] * 1 + [Flow("reports", "t.echo", 2)],
        )
    )
    return emq


def totals(response, names=("mail", "reports")) -> dict[str, dict[str, int]]:
    """The chart totals of ``names`` (the settings' queues show too, empty)."""
    return {
        q["name"]: q["chart"]["totals"] for q in response.context["queues"] if q["name"] in names
    }


def test_staff_sees_every_queue_with_its_counts_and_chart(work, staff):
    response = staff.get(reverse(PAGE))
    assert response.status_code == 200
    assert totals(response) == {
        "mail": {"added": 4, "completed": 2, "failed": 1, "dead": 1},
        "reports": {"added": 3, "completed": 0, "failed": 0, "dead": 0},
    }
    mail = next(q for q in response.context["queues"] if q["name"] == "mail")
    counts = mail["stats"]["counts"]
    assert (counts["pending"], counts["delayed"], counts["dead"]) == (0, 1, 1)  # c backs off
    assert len(mail["chart"]["cols"]) == 60  # the hour, a column a minute
    html = response.content.decode()
    assert 'aria-label="mail, last 60 minutes: 4 added, 2 completed, 1 failed, 1 dead"' in html
    assert html.count('class="emq-fill-completed"') in (1, 2)  # the busy minute (or two)
    assert 'id="emq-queue-reports"' in html
    assert "echomq_django/dashboard.js" in html


def test_the_json_endpoint_answers_the_numbers_and_the_body(work, staff):
    response = staff.get(reverse(JSON) + "?queue=mail")
    assert response.status_code == 200
    data = json.loads(response.content)
    assert list(data["queues"]) == ["mail"]
    mail = data["queues"]["mail"]
    assert mail["totals"] == {"added": 4, "completed": 2, "failed": 1, "dead": 1}
    assert len(mail["series"]) == 60
    assert sum(row[1] for row in mail["series"]) == 4  # [minute, added, completed, failed, dead]
    assert mail["counts"]["delayed"] == 1
    assert 'id="emq-queue-mail"' in data["html"]


def test_the_day_is_sixty_columns_of_twenty_four_minutes(work, staff):
    response = staff.get(reverse(PAGE) + "?range=day&queue=mail")
    cols = response.context["queues"][0]["chart"]["cols"]
    assert (len(cols), {c["minutes"] for c in cols}) == (COLUMNS, {MINUTES_KEPT // COLUMNS})
    assert totals(response)["mail"]["added"] == 4


def test_bad_input_is_named(work, staff):
    response = staff.get(reverse(PAGE) + "?queue=nope")
    assert response.status_code == 404
    assert response.content.decode().startswith(
        "unknown queue 'nope': no job, setting or live process uses it; known queues: "
    )
    response = staff.get(reverse(PAGE) + "?range=week")
    assert (response.status_code, response.content.decode()) == (
        400,
        "range 'week': the counters keep the last 1440 minutes; ask for one of: hour, day",
    )


def test_the_dashboard_is_staff_only(work, client):
    client.force_login(UserFactory())
    response = client.get(reverse(PAGE))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_with_redis_down_the_page_says_so(staff, monkeypatch, r):
    monkeypatch.setenv("ECHOMQ_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    conf.reset()
    try:
        response = staff.get(reverse(PAGE))
        assert response.status_code == 200
        assert "Could not read Redis: " in response.content.decode()
    finally:
        conf.reset()


def test_a_chart_scales_to_its_busiest_column():
    rows = [
        {"minute": m, "added": a, "completed": c, "failed": 0, "dead": d}
        for m, a, c, d in [(1, 2, 1, 1), (2, 0, 4, 0)]
    ]
    got = chart(rows)
    assert (got["peak"], got["totals"]) == (
        4,
        {"added": 2, "completed": 5, "failed": 0, "dead": 1},
    )
    assert [[(r["kind"], r["y"], r["height"]) for r in c["rects"]] for c in got["cols"]] == [
        [("completed", "45.0", "15.0"), ("dead", "30.0", "15.0")],
        [("completed", "0.0", "60.0")],
    ]
    assert got["line"] == "150.0,30.0 450.0,60.0"


def test_the_dashboard_lists_a_queues_groups(emq, staff):
    """Groups (docs/explanation/protocol.md#groups): the busiest first, paused
    ones marked; a queue without groups shows no group table."""
    for i in range(3):
        emq.enqueue("tenant", "t.echo", i, group="big")
    emq.enqueue("tenant", "t.echo", 9, group="small")
    emq.enqueue("plain", "t.echo", 1)
    emq.groups.pause("tenant", "small")
    response = staff.get(reverse(PAGE))
    tenant = next(q for q in response.context["queues"] if q["name"] == "tenant")
    assert tenant["groups"] == [
        {"name": "big", "pending": 3, "active": 0, "paused": False, "concurrency": None},
        {"name": "small", "pending": 1, "active": 0, "paused": True, "concurrency": None},
    ]
    html = response.content.decode()
    assert 'id="emq-groups-tenant"' in html and "<summary>Groups: 2</summary>" in html
    assert "<td>small</td><td>1</td><td>0</td><td>paused</td><td>none</td>" in html
    assert 'id="emq-groups-plain"' not in html


def test_the_json_says_why_when_redis_is_down_and_keeps_its_shape(staff, monkeypatch):
    """Redis away while the page is open: the JSON names the reason (the
    page's script shows it and keeps its numbers), ``queues`` still a dict."""
    from echomq_django.admin import dashboard as board
    from echomq_django.core.exceptions import RedisUnavailable

    def down(*args, **kwargs):
        raise RedisUnavailable("Redis is unreachable at redis://127.0.0.1:1/0")

    monkeypatch.setattr(board, "dashboard", down)
    data = staff.get(reverse(JSON)).json()
    assert data == {
        "live_error": "Redis is unreachable at redis://127.0.0.1:1/0",
        "queues": {},
        "minutes": 60,
        "at": None,
    }
