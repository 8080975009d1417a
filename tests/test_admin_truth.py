"""Each admin page says one true thing (docs/howto/operate.md#what-the-admins-pages-show),
through the Django test client: a value shown once, live when Redis answers
and "As of <time> (mirror)" when it does not; one date format (Django's
``DATETIME_FORMAT`` in the active language); a parent's "still to finish"
that counts only children able to finish; plain words.

Redis "down" is a real client on a port nothing listens on
(``ECHOMQ_URL=redis://127.0.0.1:1/0``), the rows mirrored before from the
private server.
"""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import formats, timezone, translation

from echomq_django import Flow, conf
from echomq_django.admin.pages import job_url
from echomq_django.core.exceptions import EchoMQError
from echomq_django.models import MirroredJob, MirroredQueue
from echomq_django.monitoring.mirror import mirror_queues, ms_to_datetime
from echomq_django.runners.heartbeat import Heartbeat
from tests.support.factories import StaffUserFactory
from tests.support.workerkit import Clock

pytestmark = pytest.mark.django_db

INVOICE = "invoice-2026-11-000123-retry"
DOWN_URL = "redis://127.0.0.1:1/0"


@pytest.fixture
def emq(r):
    conf.reset()
    mq = conf.get_mq()
    mq.clock = Clock()
    yield mq
    conf.reset()


@pytest.fixture
def staff(client):
    client.force_login(StaffUserFactory())
    return client


@pytest.fixture
def redis_down(monkeypatch):
    """Point the process's ``EchoMQ`` at a port nothing listens on; returns
    the reason its reads give (the text the pages must show)."""

    def down() -> str:
        monkeypatch.setenv("ECHOMQ_URL", DOWN_URL)
        conf.reset()
        try:
            conf.get_mq().counts("billing")
        except EchoMQError as err:
            return str(err)
        raise AssertionError("a client on port 1 answered")

    yield down
    conf.reset()


def when(dt) -> str:
    """``dt`` as the admin shows every date: DATETIME_FORMAT, local time."""
    return formats.date_format(timezone.localtime(dt), "DATETIME_FORMAT")


def retried_once(mq) -> None:
    """``INVOICE`` on ``billing``: 2 attempts allowed, the first failed (and
    mirrored so: 1 of 2, pending), the second running now (2 of 2, live)."""
    mq.enqueue("billing", "billing.render", {"n": 1}, job_id=INVOICE, max_attempts=2, backoff_ms=0)
    [job] = mq.claim("billing", 1)
    mq.clock.advance(1000)
    assert mq.fail(job, "TimeoutError: renderer") == "pending"
    mirror_queues(mq, ["billing"], full=True)
    mq.clock.advance(1000)
    [again] = mq.claim("billing", 1)
    assert again.attempts == 2


def job_html(client, queue: str, job_id: str) -> str:
    response = client.get(job_url(queue, job_id), follow=True)
    assert response.status_code == 200
    return response.content.decode()


def test_a_job_page_shows_its_attempts_once_live_in_one_date_format(emq, staff):
    retried_once(emq)
    row = MirroredJob.objects.get(job_id=INVOICE)
    assert (row.attempts, row.max_attempts, row.state) == (1, 2, "pending")
    html = job_html(staff, "billing", INVOICE)
    live = emq.get_job("billing", INVOICE)
    assert '<h2 id="emq-source">Live in Redis</h2>' in html
    assert '<td id="emq-attempts">2 of 2</td>' in html
    assert "1 of 2" not in html and "Tries" not in html
    assert '<td id="emq-state"><span class="emq-badge emq-state-active">active</span></td>' in html
    created = ms_to_datetime(live.created_at)
    assert f'<td id="emq-created">{when(created)}</td>' in html
    lease = ms_to_datetime(live.lease_deadline)
    assert f'<td id="emq-lease">{when(lease)}</td>' in html
    assert f'<div class="readonly">{when(row.mirrored_at)}</div>' in html  # mirrored at
    # plain words for the mirror's copy of the values
    assert "Payload, result and error in the job list:" in html
    assert '<div class="readonly">in full</div>' in html
    assert "in this row" not in html and "whole" not in html


def test_dates_follow_the_active_language(emq, staff, settings):
    retried_once(emq)
    settings.LANGUAGE_CODE = "de"
    html = job_html(staff, "billing", INVOICE)
    live = emq.get_job("billing", INVOICE)
    created = ms_to_datetime(live.created_at)
    with translation.override("de"):
        expected = when(created)
    with translation.override("en"):
        assert expected != when(created)  # not the English format
    assert f'<td id="emq-created">{expected}</td>' in html


def test_a_trimmed_copy_says_so_in_plain_words(emq, staff):
    emq.enqueue("billing", "billing.render", {"blob": "x" * 5000}, job_id="big")
    mirror_queues(emq, ["billing"], full=True)
    html = job_html(staff, "billing", "big")
    assert '<div class="readonly">cut to their first 4096 characters</div>' in html


def test_with_redis_down_a_job_page_shows_the_mirror_as_of_its_time(emq, staff, redis_down):
    retried_once(emq)
    row = MirroredJob.objects.get(job_id=INVOICE)
    reason = redis_down()
    html = job_html(staff, "billing", INVOICE)
    assert f'<p class="errornote" id="emq-redis-error">Could not read Redis: {reason}</p>' in html
    assert f'<h2 id="emq-source">As of {when(row.mirrored_at)} (mirror)</h2>' in html
    assert '<td id="emq-attempts">1 of 2</td>' in html
    assert "2 of 2" not in html and "Live in Redis" not in html
    assert (
        '<td id="emq-state"><span class="emq-badge emq-state-pending">pending</span></td>' in html
    )
    assert '<pre class="emq-error emq-error-head">TimeoutError: renderer</pre>' in html
    assert '<pre class="emq-payload">{\n  &quot;n&quot;: 1\n}</pre>' in html  # as live shows it


def test_a_job_gone_from_redis_shows_the_mirror_as_of_its_time(emq, staff):
    retried_once(emq)
    row = MirroredJob.objects.get(job_id=INVOICE)
    emq.client.delete(f"emq:{{billing}}:job:{INVOICE}")
    html = job_html(staff, "billing", INVOICE)
    assert "This job is not in Redis any more" in html
    assert f'<h2 id="emq-source">As of {when(row.mirrored_at)} (mirror)</h2>' in html
    assert '<td id="emq-attempts">1 of 2</td>' in html


def deps_line(html: str) -> str:
    start = html.index('<p id="emq-deps">')
    return html[start : html.index("</p>", start) + 4]


def two_children(mq, parent: str) -> None:
    mq.add_flow(
        Flow(
            "billing",
            "billing.close",
            {},
            job_id=parent,
            children=[
                Flow("billing", "billing.render", {}, job_id=f"{parent}-a"),
                Flow("billing", "billing.render", {}, job_id=f"{parent}-b"),
            ],
        )
    )


def test_a_dead_parent_whose_children_all_ended_has_none_to_finish(emq, staff):
    two_children(emq, "close")
    jobs = {j.id: j for j in emq.claim("billing", 2)}
    emq.complete(jobs["close-b"], 1)
    emq.fail(jobs["close-a"], "CardDeclined: no", dead=True)
    assert emq.get_job("billing", "close").state == "dead"
    assert emq.dependency_counts("billing", "close")["remaining"] == 1  # kept for a retry
    mirror_queues(emq, ["billing"], full=True)
    assert deps_line(job_html(staff, "billing", "close")) == (
        '<p id="emq-deps">2 children: <strong>1</strong> completed, <strong>1</strong> failed '
        "the parent, <strong>0</strong> died and were ignored, <strong>0</strong> removed; "
        'still to finish: <strong id="emq-remaining">0</strong>.</p>'
    )


def test_a_dead_parent_counts_a_child_still_pending(emq, staff):
    two_children(emq, "close")
    [first] = emq.claim("billing", 1)
    emq.fail(first, "CardDeclined: no", dead=True)
    mirror_queues(emq, ["billing"], full=True)
    html = job_html(staff, "billing", "close")
    assert 'still to finish: <strong id="emq-remaining">1</strong>.</p>' in deps_line(html)
    assert "emq-undelivered" not in html


def test_a_child_finished_on_another_queue_is_on_its_way_not_to_finish(emq, staff):
    emq.add_flow(
        Flow(
            "billing",
            "billing.close",
            {},
            job_id="close",
            children=[Flow("mail", "mail.send", {}, job_id="statement")],
        )
    )
    emq.cross_queue_scripts = False  # as on a Cluster: through the flow outbox
    [child] = emq.claim("mail", 1)
    emq.complete(child, "sent")  # its word waits in mail's outbox for the pump
    mirror_queues(emq, ["billing", "mail"], full=True)
    assert deps_line(job_html(staff, "billing", "close")).endswith(
        'still to finish: <strong id="emq-remaining">0</strong>. Finished, on their way to '
        'this parent (the pump delivers them): <strong id="emq-undelivered">1</strong>.</p>'
    )


def test_the_workers_page_says_only_that_redis_is_down(emq, staff, redis_down):
    Heartbeat(emq, "worker", ["billing"], interval_s=5).beat()
    workers = reverse("admin:echomq_django_mirroredqueue_workers")
    assert "Read live from Redis" in staff.get(workers).content.decode()
    reason = redis_down()
    html = staff.get(workers).content.decode()
    assert f'<p class="errornote" id="emq-redis-error">Could not read Redis: {reason}</p>' in html
    assert "Read live from Redis" not in html and "No worker or pump" not in html


def queue_html(client, queue: str) -> str:
    response = client.get(reverse("admin:echomq_django_mirroredqueue_change", args=[queue]))
    assert response.status_code == 200
    return response.content.decode()


def test_a_queue_page_shows_its_counts_once(emq, staff, redis_down):
    retried_once(emq)  # mirrored: 1 pending; live: 1 active
    html = queue_html(staff, "billing")
    assert '<h2 id="emq-source">Live in Redis</h2>' in html
    assert "<tr><th>pending</th><td>0</td></tr><tr><th>active</th><td>1</td></tr>" in html
    assert html.count("<th>pending</th>") == 1
    assert '<td id="emq-paused"><span class="emq-flag-no">no</span></td>' in html
    row = MirroredQueue.objects.get(queue="billing")
    reason = redis_down()
    html = queue_html(staff, "billing")
    assert f'<p class="errornote" id="emq-redis-error">Could not read Redis: {reason}</p>' in html
    assert f'<h2 id="emq-source">As of {when(row.mirrored_at)} (mirror)</h2>' in html
    assert "<tr><th>pending</th><td>1</td></tr><tr><th>active</th><td>0</td></tr>" in html
    assert "Live in Redis" not in html and 'id="emq-paused"' not in html
    listing = staff.get(reverse("admin:echomq_django_mirroredqueue_changelist")).content.decode()
    assert f'<td class="field-paused"><span title="Could not read Redis: {reason}">?</span>' in (
        listing
    )


def test_the_lists_say_when_they_were_mirrored_in_the_admin_format(emq, staff):
    retried_once(emq)
    row = MirroredQueue.objects.get(queue="billing")
    for name in ("mirroredjob", "mirroredqueue"):
        html = staff.get(reverse(f"admin:echomq_django_{name}_changelist")).content.decode()
        assert f'<span class="emq-mirrored-queue">billing {when(row.mirrored_at)} (' in html
        assert " UTC" not in html
