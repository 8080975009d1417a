"""Periodic entries at run time (``emq.schedules``,
docs/howto/periodic.md#schedules-at-run-time): upsert, list and remove
beside the read-only ``ECHOMQ["SCHEDULE"]``; bad input refused by the
settings' check ids before any write; pumps fire a run-time entry once per
tick however many run, on both rigs."""

from __future__ import annotations

import logging

import pytest

import echomq_django as emq
from echomq_django import conf
from echomq_django.runners.periodic import Entry, Scheduler
from tests.support.jobkit import assert_state
from tests.support.workerapp import jobs as _handlers  # noqa: F401  (t.echo)

MINUTE = 60_000


@pytest.fixture
def site(r, settings):
    """The settings' ``EchoMQ`` on the private server, with one settings entry."""
    settings.ECHOMQ = {
        **settings.ECHOMQ,
        "SCHEDULE": {"nightly": {"name": "t.echo", "queue": "reports", "cron": "0 3 * * *"}},
    }
    conf.reset()
    yield conf.get_mq()
    conf.reset()


def test_upsert_list_and_remove_beside_the_settings(site) -> None:
    row = emq.schedules.upsert("beat", handler="t.echo", queue="q", every_s=60, payload={"n": 1})
    now = site.clock()
    assert row == {
        "entry": "beat",
        "name": "t.echo",
        "queue": "q",
        "schedule": "every 60 s",
        "payload": {"n": 1},
        "last_tick": now - now % MINUTE,  # marked: its first job is the next tick
        "next_tick": now - now % MINUTE + MINUTE,
        "read_only": False,
        "paused": False,
    }
    listed = emq.schedules.list()
    assert [(r["entry"], r["queue"], r["read_only"]) for r in listed] == [
        ("nightly", "reports", True),
        ("beat", "q", False),
    ]
    moved = emq.schedules.upsert("beat", handler="t.echo", queue="other", cron="*/5 * * * *")
    assert (moved["queue"], moved["schedule"], moved["payload"]) == ("other", "*/5 * * * *", None)
    assert [(r["entry"], r["queue"]) for r in emq.schedules.list()][1:] == [("beat", "other")]
    assert (emq.schedules.remove("beat"), emq.schedules.remove("beat")) == (True, False)
    assert [r["entry"] for r in emq.schedules.list()] == ["nightly"]
    assert not site.client.exists(site.keys.queue("other").schedule("beat"))  # its mark went too


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"handler": "no.such.job", "every_s": 60}, "has no handler (echomq_django.E056"),
        ({"handler": "t.echo", "cron": "0 0 30 2 *"}, "never fires (echomq_django.E054"),
        ({"handler": "t.echo", "cron": "every day"}, "malformed cron expression"),
        ({"handler": "t.echo"}, "exactly one of 'cron' and 'every_s' (echomq_django.E055"),
        ({"handler": "t.echo", "every_s": 60, "cron": "* * * * *"}, "exactly one of"),
        ({"handler": "t.echo", "every_s": 0}, "every_s must be a whole number of seconds"),
        ({"handler": "t.echo", "every_s": 60, "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"handler": "t.echo", "every_s": 60, "payload": {1, 2}}, "(echomq_django.E058"),
    ],
    ids=["unknown-handler", "never-fires", "malformed", "neither", "both", "zero", "tz", "payload"],
)
def test_bad_entries_are_refused_before_any_write(site, kwargs, rule) -> None:
    with pytest.raises(ValueError, match=rule.replace("(", r"\(").replace(")", r"\)")):
        emq.schedules.upsert("beat", queue="q", **kwargs)
    assert site.client.keys("emq*") == []


def test_settings_entries_and_bad_names_are_refused(site) -> None:
    with pytest.raises(ValueError, match=r"'nightly' is in ECHOMQ\['SCHEDULE'\]: settings entries"):
        emq.schedules.upsert("nightly", handler="t.echo", queue="q", every_s=60)
    with pytest.raises(ValueError, match="read-only"):
        emq.schedules.remove("nightly")
    with pytest.raises(ValueError, match="echomq_django.E052"):
        emq.schedules.upsert("a b", handler="t.echo", queue="q", every_s=60)
    with pytest.raises(ValueError, match="echomq_django.E053"):
        emq.schedules.upsert("beat", handler="t.echo", queue="a{b", every_s=60)
    assert site.client.keys("emq*") == []


def test_pumps_fire_a_run_time_entry_once_per_tick(tmq, clock) -> None:
    spec = {"name": "t.echo", "queue": "q", "every_s": 60, "payload": 5}
    tmq.schedule_store.put("q", "beat", spec)
    pumps = [Scheduler(tmq, [], runtime_queues=["q"]) for _ in range(3)]
    assert [p.fire_due() for p in pumps] == [[], [], []]  # a first sight marks, fires nothing
    clock.now = pumps[0].next_due()
    fired = [job for p in pumps for job in p.fire_due()]
    assert fired == [("q", f"beat-{clock.now}")]
    assert_state(tmq, "q", f"beat-{clock.now}", "pending")
    assert tmq.get_job("q", f"beat-{clock.now}").payload == 5
    tmq.schedule_store.delete("q", "beat")
    clock.advance(MINUTE)
    assert [p.fire_due() for p in pumps] == [[], [], []]  # removed: no more jobs
    assert [p.entries for p in pumps] == [[], [], []]


def test_a_settings_entry_wins_over_a_run_time_one_of_its_name(tmq, clock, caplog) -> None:
    tmq.schedule_store.put("q", "beat", {"name": "t.echo", "queue": "q", "every_s": 60})
    fixed = Entry(key="beat", name="t.echo", queue="q", every_s=3600)
    with caplog.at_level(logging.WARNING, logger="echomq_django.schedule"):
        scheduler = Scheduler(tmq, [fixed], runtime_queues=["q"])
        scheduler.fire_due()
    assert scheduler.entries == [fixed]
    assert "run-time periodic entry beat on q left out" in caplog.text


def test_a_queue_holds_a_bounded_number_of_run_time_entries(mq, monkeypatch) -> None:
    from echomq_django.core.exceptions import EchoMQError
    from echomq_django.protocol.control import schedules

    monkeypatch.setattr(schedules, "MAX_RUNTIME_ENTRIES", 2)
    spec = {"name": "t.echo", "queue": "q", "every_s": 60}
    assert [mq.schedule_store.put("q", f"e{i}", spec) for i in range(2)] == [True, True]
    assert mq.schedule_store.put("q", "e1", spec) is False  # a change, not a third
    with pytest.raises(EchoMQError, match="holds 2 run-time periodic entries, the most it may"):
        mq.schedule_store.put("q", "e2", spec)
    assert sorted(mq.schedule_store.read(["q"])["q"]) == ["e0", "e1"]


def test_stats_list_the_run_time_entries_after_the_settings_ones(site) -> None:
    from echomq_django.monitoring.stats import collect

    emq.schedules.upsert("beat", handler="t.echo", queue="q", every_s=60)
    listed = [(e["entry"], e["queue"], e["schedule"]) for e in collect(site)["schedule"]]
    assert listed == [("nightly", "reports", "0 3 * * *"), ("beat", "q", "every 60 s")]


def test_pause_resume_edit_and_run_now(site) -> None:
    from tests.support.workerkit import Clock

    site.clock = Clock()
    emq.schedules.upsert("beat", handler="t.echo", queue="q", every_s=60, payload=7)
    pump = Scheduler(site, [], runtime_queues=["q"])
    assert pump.fire_due() == []  # a first sight marks
    assert (emq.schedules.pause("beat"), emq.schedules.pause("beat")) == (True, False)
    assert [(r["entry"], r["paused"]) for r in emq.schedules.list()] == [
        ("nightly", False),
        ("beat", True),
    ]
    site.clock.advance(3 * MINUTE)
    assert (pump.fire_due(), pump.entries) == ([], [])  # paused: no job, three ticks on
    assert emq.schedules.get("beat") == {
        "handler": "t.echo",
        "queue": "q",
        "every_s": 60,
        "payload": 7,
        "paused": True,
    }
    emq.schedules.upsert("beat", handler="t.echo", queue="q", every_s=60, payload=8)
    assert emq.schedules.get("beat")["paused"] is True  # an edit keeps it paused
    assert (emq.schedules.resume("beat"), emq.schedules.resume("beat")) == (True, False)
    assert pump.fire_due() == []  # the ticks it slept through are skipped
    site.clock.now = pump.next_due()
    assert pump.fire_due() == [("q", f"beat-{site.clock.now}")]
    assert site.get_job("q", f"beat-{site.clock.now}").payload == 8
    # run now: a settings entry too, outside its ticks, its marks unchanged
    last = site.timers.schedule_last("reports", "nightly")
    assert emq.schedules.run_now("nightly") == ("reports", f"nightly-now-{site.clock.now}")
    assert_state(site, "reports", f"nightly-now-{site.clock.now}", "pending")
    assert site.timers.schedule_last("reports", "nightly") == last
    site.clock.advance(1)
    assert emq.schedules.run_now("beat") == ("q", f"beat-now-{site.clock.now}")
    assert site.get_job("q", f"beat-now-{site.clock.now}").payload == 8


def test_pause_and_run_now_name_what_is_wrong(site) -> None:
    emq.schedules.upsert("beat", handler="t.echo", queue="q", every_s=60)
    with pytest.raises(ValueError, match=r"'nightly' is in ECHOMQ\['SCHEDULE'\]: read-only"):
        emq.schedules.pause("nightly")
    with pytest.raises(
        ValueError, match="no run-time periodic entry 'nope'; run-time entries: beat"
    ):
        emq.schedules.resume("nope")
    # Run now takes the settings' entries too, so its error names them
    with pytest.raises(ValueError, match=r"^no periodic entry 'nope'; entries: beat, nightly$"):
        emq.schedules.run_now("nope")
    assert [r["paused"] for r in emq.schedules.list()] == [False, False]
