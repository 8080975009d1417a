"""The live-workers page's commands (admin/worker_commands.py): guarded by
``echomq_django.command_worker``, sent through ``mq.commands``, the
worker's reply shown, each one recorded as a ``LogEntry``."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from echomq_django import conf
from tests.support.factories import StaffUserFactory
from tests.test_worker_commands import fake_worker, start

pytestmark = pytest.mark.django_db

WORKERS = reverse("admin:echomq_django_mirroredqueue_workers")


@pytest.fixture
def emq(r):
    conf.reset()
    yield conf.get_mq()
    conf.reset()


def login(client, *perms):
    user = StaffUserFactory(permissions=list(perms))
    client.force_login(user)
    return user


def test_without_the_permission_there_is_no_form_and_a_post_is_refused(client, emq):
    fake_worker(emq)
    login(client)
    page = client.get(WORKERS).content.decode()
    assert "<code>ghost:1:abc</code>" in page and 'name="command"' not in page
    response = client.post(WORKERS, {"worker": "ghost:1:abc", "command": "shutdown"})
    assert response.status_code == 403
    assert emq.commands.recent() == []
    assert LogEntry.objects.count() == 0


def test_a_command_is_sent_replied_shown_and_logged(client, emq):
    worker, bg = start(emq)
    user = login(client, "command_worker")
    try:
        assert 'name="command"' in client.get(WORKERS).content.decode()
        done = client.post(
            WORKERS, {"worker": worker.process_id, "command": "pool-grow", "n": "1"}, follow=True
        )
        assert [str(m) for m in get_messages(done.wsgi_request)] == [
            f"Sent pool-grow 1 to {worker.process_id}: done: 2 -> 3 handlers."
        ]
        assert worker.loop.concurrency == 3
        [entry] = LogEntry.objects.all()
        assert (entry.user_id, entry.object_id, entry.action_flag, entry.change_message) == (
            user.pk,
            worker.process_id,
            CHANGE,
            "Sent pool-grow 1 (admin command)",
        )
        [row] = done.context["recent_commands"]
        assert (row["command"], row["n"], row["state"]) == ("pool-grow", 1, "done")
        assert "<td>2 -&gt; 3 handlers</td>" in done.content.decode()
    finally:
        worker.stop()
        bg.join()


@pytest.mark.parametrize(
    ("form", "error"),
    [
        (
            {"worker": "nope:9:x", "command": "drain"},
            "unknown worker id 'nope:9:x'; live workers: ghost:1:abc",
        ),
        (
            {"worker": "ghost:1:abc", "command": "pool-grow", "n": "x"},
            "pool-grow takes N, a whole number of handlers 1-10000, got 'x'",
        ),
        ({"worker": "ghost:1:abc", "command": "drain", "n": "2"}, "drain takes no N, got 2"),
    ],
)
def test_a_bad_command_is_an_error_message_and_nothing_is_sent(client, emq, form, error):
    fake_worker(emq)
    login(client, "command_worker")
    done = client.post(WORKERS, form, follow=True)
    assert [str(m) for m in get_messages(done.wsgi_request)] == [f"Not sent: {error}"]
    assert emq.commands.recent() == []
    assert LogEntry.objects.count() == 0
