"""The admin's operations, each the library's own call: cancel and
remove selected jobs behind a confirmation page, pause and resume queues;
each guarded by ``echomq_django.manage_job`` and logged."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from echomq_django import conf
from echomq_django.models import MirroredJob, MirroredQueue
from echomq_django.monitoring.mirror import mirror_queues
from tests.support.factories import login_staff
from tests.support.workerkit import Clock

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:echomq_django_mirroredjob_changelist")
QUEUES = reverse("admin:echomq_django_mirroredqueue_changelist")


@pytest.fixture
def emq(r):
    conf.reset()
    mq = conf.get_mq()
    mq.clock = Clock()
    mq.enqueue("ops", "t.echo", {}, job_id="done")
    mq.enqueue("ops", "t.echo", {}, job_id="queued")
    [done] = mq.claim("ops", 1)
    mq.complete(done, 1)
    mirror_queues(mq, ["ops"], full=True)
    yield mq
    conf.reset()


def pk(job_id: str) -> int:
    return MirroredJob.objects.get(queue="ops", job_id=job_id).pk


def act(client, url, action, pks, confirm):
    data = {"action": action, "_selected_action": [str(p) for p in pks]}
    if confirm:
        data["post"] = "yes"
    return client.post(url, data, follow=confirm)


def test_the_operations_need_their_permission(client, emq):
    login_staff(client)
    actions = [
        a
        for a, _ in client.get(JOBS)
        .context["cl"]
        .model_admin.get_action_choices(client.get(JOBS).wsgi_request)
    ]
    assert "cancel_jobs" not in actions and "remove_jobs" not in actions
    response = act(client, JOBS, "cancel_jobs", [pk("queued")], confirm=True)
    assert emq.get_job("ops", "queued").state == "pending"  # nothing done
    assert response.status_code == 200


def test_cancel_asks_then_kills_the_job_and_logs_it(client, emq):
    user = login_staff(client, "manage_job")
    page = act(client, JOBS, "cancel_jobs", [pk("queued")], confirm=False)
    assert page.status_code == 200
    assert page.context["question"].startswith("Cancel these jobs?")
    assert [(j["id"], j["state"]) for j in page.context["jobs"]] == [("queued", "pending")]
    assert emq.get_job("ops", "queued").state == "pending"  # asked, not done
    done = act(client, JOBS, "cancel_jobs", [pk("queued")], confirm=True)
    assert [str(m) for m in get_messages(done.wsgi_request)] == [
        "Cancelled ops/queued (it was pending)."
    ]
    job = emq.get_job("ops", "queued")
    assert (job.state, job.error) == ("dead", "cancelled")
    assert MirroredJob.objects.get(queue="ops", job_id="queued").state == "dead"
    [entry] = LogEntry.objects.filter(user=user)
    assert entry.change_message == "Cancelled (admin action)"


def test_remove_takes_the_job_out_of_redis_and_refuses_what_it_must(client, emq):
    login_staff(client, "manage_job")
    done = act(client, JOBS, "remove_jobs", [pk("done")], confirm=True)
    assert [str(m) for m in get_messages(done.wsgi_request)] == ["Removed ops/done."]
    assert emq.client.exists(emq.keys.job("ops", "done")) == 0
    assert not MirroredJob.objects.filter(queue="ops", job_id="done").exists()  # left the mirror
    [held] = emq.claim("ops", 1)  # "queued" is active now
    assert held.id == "queued"
    refused = act(client, JOBS, "remove_jobs", [pk("queued")], confirm=True)
    [message] = [str(m) for m in get_messages(refused.wsgi_request)]
    assert message.startswith("Not removed: job 'queued' in queue 'ops' is active")


def test_pause_and_resume_queues(client, emq):
    user = login_staff(client, "manage_job")
    row = MirroredQueue.objects.get(queue="ops")
    act(client, QUEUES, "pause_queues", [row.pk], confirm=True)
    assert emq.is_paused("ops") is True
    listing = client.get(QUEUES).content.decode()
    assert '<span class="emq-flag-yes">paused</span>' in listing
    again = act(client, QUEUES, "pause_queues", [row.pk], confirm=True)
    assert [str(m) for m in get_messages(again.wsgi_request)] == ["ops was paused already."]
    act(client, QUEUES, "resume_queues", [row.pk], confirm=True)
    assert emq.is_paused("ops") is False
    assert [e.change_message for e in LogEntry.objects.filter(user=user).order_by("pk")] == [
        "Paused (admin action)",
        "Resumed (admin action)",
    ]


def test_the_lists_name_known_queues_the_mirror_has_not_reached(client, emq):
    login_staff(client)
    emq.enqueue("fresh", "t.echo", {})  # in P:queues now, not mirrored yet
    # inventory... are only named in ECHOMQ["QUEUES"]: the hint does not say "in Redis"
    hint = (
        "Not mirrored yet: fresh, inventory, orders, payments, validation (used in Redis, "
        'named in ECHOMQ["QUEUES"] or served by a live worker).'
    )
    assert hint in client.get(JOBS).content.decode().replace("&quot;", '"')
    assert hint in client.get(QUEUES).content.decode().replace("&quot;", '"')
    mirror_queues(emq, ["fresh"])
    assert "Not mirrored yet: inventory," in client.get(JOBS).content.decode()
