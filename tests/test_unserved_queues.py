"""A queue no one serves, seen from the producer side: ``enqueue("defualt",
...)`` logs one WARNING per process per queue when no setting names the
queue and no live worker serves it; the admin's queue list says "no worker
for N s"; ``check`` warns about SCHEDULE and TASKS queues that look unknown
(W090, W091)."""

from __future__ import annotations

import logging

import pytest
from django.core.checks import run_checks
from django.db import transaction
from django.test import override_settings

import echomq_django as emq
from echomq_django import conf
from echomq_django.admin import display
from echomq_django.api import adds as api
from echomq_django.checks import check_queue_names
from echomq_django.models import MirroredQueue
from echomq_django.runners.heartbeat import Heartbeat

WARNED = "which ECHOMQ['QUEUES'] does not name and no live worker serves"


@pytest.fixture
def mq(r, transactional_db):
    """The settings' EchoMQ (module-level API) on the private server, with
    the per-process look-ups forgotten."""
    conf.reset()
    api._unserved_at.clear()
    api._unserved_warned.clear()
    yield conf.get_mq()
    api._unserved_at.clear()
    api._unserved_warned.clear()
    conf.reset()


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "echomq_django.api"]


def test_a_typo_warns_once_per_process(mq, caplog):
    with caplog.at_level(logging.WARNING, logger="echomq_django.api"):
        emq.enqueue("defualt", "t.echo", 1)
        emq.enqueue("defualt", "t.echo", 2)
        emq.enqueue_many("defualt", [("t.echo", 3)])
    assert warnings(caplog) == [
        "job added to queue 'defualt', which ECHOMQ['QUEUES'] does not name and no live "
        "worker serves: it waits until a worker runs on 'defualt'. A typo? Queues in the "
        "settings: inventory, orders, payments, validation; served by live workers: (none)"
    ]
    assert mq.counts("defualt")["pending"] == 3  # accepted all the same


def test_a_queue_the_settings_name_costs_no_read(mq, caplog):
    with caplog.at_level(logging.WARNING, logger="echomq_django.api"):
        emq.enqueue("orders", "t.echo", 1)
    assert warnings(caplog) == [] and api._unserved_at == {}


def test_a_served_queue_does_not_warn_and_is_read_once_a_minute(mq, caplog):
    hb = Heartbeat(mq, "worker", ["audit"], interval_s=5)
    hb.beat()
    try:
        with caplog.at_level(logging.WARNING, logger="echomq_django.api"):
            emq.enqueue("audit", "t.echo", 1)
            looked = dict(api._unserved_at)
            emq.enqueue("audit", "t.echo", 2)
    finally:
        mq.presence.leave(hb.info.id, hb.info.queues)
    assert warnings(caplog) == []
    assert api._unserved_at == looked and list(looked) == ["audit"]  # one look-up


def test_a_deferred_add_and_a_flow_warn_after_the_commit(mq, caplog):
    with caplog.at_level(logging.WARNING, logger="echomq_django.api"):
        with transaction.atomic():
            emq.enqueue("emials", "t.echo", 1)
            assert warnings(caplog) == []
        emq.add_flow(emq.Flow("orders", "t.sum_children", children=[emq.Flow("repots", "t.echo")]))
    assert [m.split(",")[0] for m in warnings(caplog)] == [
        "job added to queue 'emials'",
        "job added to queue 'repots'",
    ]


def test_the_look_ups_are_bounded(mq, monkeypatch):
    monkeypatch.setattr(api, "UNSERVED_MAX", 2)
    for q in ("a1", "a2", "a3"):
        emq.enqueue(q, "t.echo", 1)
    assert len(api._unserved_at) <= 2 and len(api._unserved_warned) <= 2


def test_the_admin_queue_list_says_no_worker_for(mq):
    mq.clock = clock = type("C", (), {"now": 1_000_000, "__call__": lambda self: self.now})()
    mq.enqueue("defualt", "t.echo", 1)
    clock.now += 12_000
    assert display.no_worker(MirroredQueue(queue="defualt")) == (
        '<span class="emq-flag-yes">no worker for 12 s</span>'
    )
    hb = Heartbeat(mq, "worker", ["defualt"], interval_s=5)
    hb.beat()
    try:
        assert display.no_worker(MirroredQueue(queue="defualt")) == "-"
    finally:
        mq.presence.leave(hb.info.id, hb.info.queues)


# -- check: SCHEDULE and TASKS queues -------------------------------------------------
GOOD = {"URL": "redis://127.0.0.1:1/0", "QUEUES": {"default": {}, "reports": {}}}
OURS = "echomq_django.tasks.EchoMQBackend"


def found(cfg, tasks=None) -> list[tuple[str, str]]:
    tasks = tasks or {"default": {"BACKEND": OURS, "QUEUES": ["default"]}}
    with override_settings(ECHOMQ=cfg, TASKS=tasks):
        return [
            (m.id, m.msg) for m in run_checks(databases=[]) if m.id.startswith("echomq_django.W")
        ]


def test_a_schedule_queue_no_setting_names_is_a_warning(no_env_url):
    every = {"name": "t.echo", "every_s": 60}
    cfg = {
        **GOOD,
        "SCHEDULE": {"nightly": {**every, "queue": "reprots"}, "ok": {**every, "queue": "reports"}},
    }
    assert found(cfg) == [
        (
            "echomq_django.W090",
            "SCHEDULE entry 'nightly' adds its jobs to queue 'reprots', which neither "
            "ECHOMQ['QUEUES'] nor TASKS names: did you mean 'reports'?",
        )
    ]


def test_a_tasks_queue_close_to_a_configured_one_is_a_warning(no_env_url):
    tasks = {"default": {"BACKEND": OURS, "QUEUES": ["defualt", "emails"]}}
    assert found(GOOD, tasks) == [
        (
            "echomq_django.W091",
            "TASKS['default'] routes tasks to queue 'defualt', which ECHOMQ['QUEUES'] does not "
            "name: did you mean 'default'?",
        )
    ]


def test_settings_that_name_no_queue_are_not_warned_about(no_env_url):
    cfg = {"URL": GOOD["URL"], "SCHEDULE": {"x": {"name": "t.echo", "every_s": 60, "queue": "q"}}}
    other = {"default": {"BACKEND": "other.Backend", "QUEUES": ["z"]}}
    with override_settings(ECHOMQ=cfg, TASKS=other):
        assert check_queue_names() == []  # only our backend's QUEUES count
