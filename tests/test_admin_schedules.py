"""The schedules page (docs/howto/periodic.md#the-admin-page) through the
Django test client on the private Redis: the settings' entries listed
read-only, run-time ones paused, resumed, edited and run now, each behind
its own permission and written to the admin log; bad input named."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

import echomq_django as emq
from echomq_django import conf
from tests.support.factories import StaffUserFactory, login_staff
from tests.support.jobkit import assert_state
from tests.support.workerapp import jobs as _handlers  # noqa: F401  (t.echo)
from tests.support.workerkit import Clock

pytestmark = pytest.mark.django_db

LIST = "admin:echomq_django_periodicentry_changelist"
ACT = "admin:echomq_django_periodicentry_act"
EDIT = "admin:echomq_django_periodicentry_change"


@pytest.fixture
def site(r, settings):
    """One settings entry (nightly) and one run-time entry (beat), on a fake clock."""
    settings.ECHOMQ = {
        **settings.ECHOMQ,
        "SCHEDULE": {"nightly": {"name": "t.echo", "queue": "reports", "cron": "0 3 * * *"}},
    }
    conf.reset()
    mq = conf.get_mq()
    mq.clock = Clock()
    emq.schedules.upsert("beat", handler="t.echo", queue="q", every_s=60, payload={"n": 1})
    yield mq
    conf.reset()


def logged(name: str) -> list[str]:
    return [e.change_message for e in LogEntry.objects.filter(object_id=name).order_by("id")]


def test_the_list_states_what_is_read_only_and_offers_what_the_user_may_do(site, client):
    login_staff(client, "view_periodicentry")
    response = client.get(reverse(LIST))
    assert response.status_code == 200
    rows = response.context["rows"]
    assert [(r["entry"], r["read_only"], r["paused"]) for r in rows] == [
        ("nightly", True, False),
        ("beat", False, False),
    ]
    html = response.content.decode()
    assert "are <strong>read-only</strong> here: change them in the settings" in html
    assert "title=\"from ECHOMQ['SCHEDULE']: read-only\">settings</span>" in html
    assert 'value="pause"' not in html and 'value="run"' not in html  # view only
    login_staff(client, "change_periodicentry", "run_periodicentry")
    html = client.get(reverse(LIST)).content.decode()
    assert html.count('value="pause"') == 1  # beat's; nightly is read-only
    assert html.count('value="run"') == 2


def test_pause_and_resume_need_the_change_permission_and_are_logged(site, client):
    login_staff(client, "view_periodicentry")
    response = client.post(reverse(ACT), {"entry": "beat", "action": "pause"})
    assert response.status_code == 403
    assert emq.schedules.get("beat")["paused"] is False
    login_staff(client, "change_periodicentry")
    response = client.post(reverse(ACT), {"entry": "beat", "action": "pause"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["Paused beat."]
    assert emq.schedules.get("beat")["paused"] is True
    assert 'data-entry="beat" data-paused="yes"' in response.content.decode()
    response = client.post(reverse(ACT), {"entry": "beat", "action": "pause"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["beat was already paused."]
    client.post(reverse(ACT), {"entry": "beat", "action": "resume"}, follow=True)
    assert emq.schedules.get("beat")["paused"] is False
    assert logged("beat") == ["Paused", "Resumed"]  # the pause that changed nothing is not
    response = client.post(reverse(ACT), {"entry": "nightly", "action": "pause"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        "periodic entry 'nightly' is in ECHOMQ['SCHEDULE']: read-only"
    ]
    assert logged("nightly") == []


def test_run_now_needs_its_own_permission_adds_one_job_and_is_logged(site, client):
    login_staff(client, "change_periodicentry")
    assert client.post(reverse(ACT), {"entry": "nightly", "action": "run"}).status_code == 403
    login_staff(client, "run_periodicentry")
    client.post(reverse(ACT), {"entry": "nightly", "action": "run"})
    job_id = f"nightly-now-{site.clock.now}"
    assert_state(site, "reports", job_id, "pending")
    assert logged("nightly") == [f"Ran now: job reports/{job_id}"]


def test_edit_goes_through_upsert_and_its_rules(site, client):
    login_staff(client, "change_periodicentry")
    url = reverse(EDIT, args=("beat",))
    response = client.get(url)
    assert response.status_code == 200
    assert response.context["form"].initial == {
        "handler": "t.echo",
        "queue": "q",
        "every_s": 60,
        "payload": {"n": 1},
    }
    form = {"handler": "t.echo", "queue": "q", "cron": "0 0 30 2 *", "payload": '{"n": 2}'}
    response = client.post(url, form)
    assert response.status_code == 200
    assert "never fires (echomq_django.E054" in response.content.decode()
    assert emq.schedules.get("beat")["every_s"] == 60  # nothing written
    response = client.post(url, {**form, "cron": "*/5 * * * *"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["Saved beat."]
    assert emq.schedules.get("beat") == {
        "handler": "t.echo",
        "queue": "q",
        "cron": "*/5 * * * *",
        "payload": {"n": 2},
        "paused": False,
    }
    assert logged("beat") == ["Changed cron, every_s, payload"]


def test_bad_input_is_named(site, client):
    login_staff(client, "view_periodicentry", "change_periodicentry")
    response = client.get(reverse(EDIT, args=("nightly",)))
    assert response.context["refused"] == (
        "periodic entry 'nightly' is in ECHOMQ['SCHEDULE']: read-only"
    )
    assert 'id="emq-refused"' in response.content.decode()
    response = client.get(reverse(EDIT, args=("nope",)))
    assert (
        response.context["refused"] == "no run-time periodic entry 'nope'; run-time entries: beat"
    )
    response = client.post(reverse(ACT), {"entry": "beat", "action": "delete"})
    assert (response.status_code, response.content.decode()) == (
        400,
        "action 'delete' on entry 'beat': give an entry and one of: pause, resume, run",
    )
    assert client.get(reverse(LIST)).status_code == 200
    client.force_login(StaffUserFactory())  # no permission on the entries
    assert client.get(reverse(LIST)).status_code == 403
