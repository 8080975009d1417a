"""Periodic jobs (``ECHOMQ["SCHEDULE"]``): exactly one job per tick however
many schedulers run, a first start fires no past tick, a restart shorter
than the period loses nothing, the schedule marks only move forward; a pump
fires its own queues' entries in its sweep and ``echomq_stats`` lists them;
and the checks of the scheduling settings, E050-E058."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from echomq_django import EchoMQ
from echomq_django.runners.periodic import Entry, Scheduler, entries
from echomq_django.runners.pump import Pump
from tests.support.jobkit import T0, assert_state, leaf, node, row

MINUTE = 60_000
GOOD = {"URL": "redis://127.0.0.1:1/0"}


def every(seconds: int, key: str = "beat", queue: str = "q", **kw) -> Entry:
    return Entry(key=key, name="ops.ping", queue=queue, every_s=seconds, **kw)


def test_every_s_ticks_fall_on_multiples_since_the_epoch() -> None:
    e = every(60)
    assert (e.last_tick(T0), e.next_tick(T0)) == (T0 - T0 % MINUTE, T0 - T0 % MINUTE + MINUTE)
    on = T0 - T0 % MINUTE
    assert (e.last_tick(on), e.next_tick(on)) == (on, on + MINUTE)


def test_cron_ticks_in_the_entry_time_zone() -> None:
    e = Entry(key="n", name="x", queue="q", cron="0 3 * * *", tz="UTC")
    day = 1_767_225_600_000  # 2026-01-01 00:00 UTC
    assert e.last_tick(day + 3 * 3_600_000) == day + 3 * 3_600_000  # on the tick: that tick
    assert e.next_tick(day) == day + 3 * 3_600_000
    paris = Entry(key="n", name="x", queue="q", cron="0 3 * * *", tz="Europe/Paris")
    assert paris.next_tick(day) == day + 2 * 3_600_000  # 03:00 in Paris is 02:00 UTC in winter


def test_a_first_start_fires_no_past_tick_then_one_job_per_tick(tmq, clock) -> None:
    s = Scheduler(tmq, [every(60, payload={"n": 1}, options={"priority": 2})])
    assert s.fire_due() == []  # the mark is set, nothing fired
    tick = s.next_due()
    clock.now = tick - 1
    assert s.fire_due() == []
    clock.now = tick
    assert s.fire_due() == [("q", f"beat-{tick}")]
    r = assert_state(tmq, "q", f"beat-{tick}", "pending")
    assert (r["name"], r["payload"], r["priority"]) == ("ops.ping", '{"n":1}', "2")
    clock.advance(30_000)
    assert s.fire_due() == []
    assert (s.fired, tmq.timers.schedule_last("q", "beat")) == (1, tick)


def test_many_schedulers_fire_each_tick_once(redis_client, clock) -> None:
    mqs = [EchoMQ(redis_client, prefix="emq", clock=clock) for _ in range(3)]
    schedulers = [Scheduler(mq, [every(60)]) for mq in mqs]
    for s in schedulers:
        s.fire_due()
    fired = []
    for _ in range(3):
        clock.now = schedulers[0].next_due()
        for s in schedulers:
            fired += s.fire_due()
    assert len(fired) == len(set(fired)) == 3
    assert redis_client.llen(mqs[0].keys.queue_key("q", "pending")) == 3


def test_a_restart_shorter_than_the_period_loses_no_tick(tmq, clock) -> None:
    Scheduler(tmq, [every(60)]).fire_due()
    tick = Scheduler(tmq, [every(60)]).next_due()
    clock.now = tick + 20_000  # down across the tick, for less than the period
    assert Scheduler(tmq, [every(60)]).fire_due() == [("q", f"beat-{tick}")]
    clock.now = tick + 5 * MINUTE + 1  # a long outage: only the latest missed tick fires
    assert Scheduler(tmq, [every(60)]).fire_due() == [("q", f"beat-{tick + 5 * MINUTE}")]


def test_a_crash_between_add_and_mark_does_not_fire_twice(tmq, clock) -> None:
    s = Scheduler(tmq, [every(60)])
    s.fire_due()
    tick = s.next_due()
    clock.now = tick
    tmq.enqueue("q", "ops.ping", None, job_id=f"beat-{tick}")  # added, mark not moved
    clock.advance(5)
    assert Scheduler(tmq, [every(60)]).fire_due() == []
    assert tmq.timers.schedule_last("q", "beat") == tick


def test_state_lists_each_entry(tmq, clock) -> None:
    s = Scheduler(tmq, [every(60)])
    assert s.state()[0]["last_tick"] is None
    s.fire_due()
    [st] = s.state()
    assert st == {
        "entry": "beat",
        "name": "ops.ping",
        "queue": "q",
        "schedule": "every 60 s",
        "last_tick": T0 - T0 % MINUTE,
        "next_tick": T0 - T0 % MINUTE + MINUTE,
    }
    assert row(tmq, "q", "x") == {}


# -- the pump fires them; stats list them --------------------------------------


def test_schedule_marks_only_move_forward(tmq) -> None:
    assert tmq.timers.advance_schedule("q", "nightly", 1000, "init") == 1000
    assert tmq.timers.advance_schedule("q", "nightly", 500, "init") == 1000
    assert tmq.timers.advance_schedule("q", "nightly", 2000, "fire") == 2000
    assert tmq.timers.advance_schedule("q", "nightly", 1500, "fire") == 2000


def test_the_pump_expires_children_and_fires_periodic_jobs(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c")], children_timeout_ms=100))
    scheduler = Scheduler(tmq, [Entry(key="beat", name="t.echo", queue="q", every_s=60)])
    pump = Pump(["q"], mq=tmq, scheduler=scheduler)
    pump.sweep()
    clock.now = scheduler.next_due()
    report = pump.sweep()["q"]
    assert (report["expired"], report["scheduled"]) == (1, 1)
    assert_state(tmq, "q", "p", "dead")
    assert_state(tmq, "q", f"beat-{clock.now}", "pending")


def test_a_pump_fires_the_settings_entries_of_its_own_queues(tmq, settings) -> None:
    beat = {"name": "t.echo", "every_s": 60}
    settings.ECHOMQ = {
        **settings.ECHOMQ,
        "SCHEDULE": {"mine": {**beat, "queue": "q"}, "theirs": {**beat, "queue": "other"}},
    }
    pump = Pump(["q"], mq=tmq)
    assert [e.key for e in pump.scheduler.entries] == ["mine"]
    settings.ECHOMQ = {k: v for k, v in settings.ECHOMQ.items() if k != "SCHEDULE"}
    assert Pump(["q"], mq=tmq).scheduler is None


def test_stats_list_the_periodic_jobs(tmq, clock, settings) -> None:
    from echomq_django.monitoring.stats import collect, render

    entry = {"name": "t.echo", "queue": "orders", "every_s": 60}
    settings.ECHOMQ = {**settings.ECHOMQ, "SCHEDULE": {"beat": entry}}
    Pump(["orders"], mq=tmq).sweep()  # the first start sets the mark
    tick = clock.now - clock.now % 60_000
    doc = collect(tmq, ["orders"])
    assert doc["schedule"] == [
        {
            "entry": "beat",
            "name": "t.echo",
            "queue": "orders",
            "schedule": "every 60 s",
            "last_tick": tick,
            "next_tick": tick + 60_000,
        }
    ]
    assert "beat   orders  t.echo  every 60 s   20 s ago     40 s" in render(doc).splitlines()


# -- settings ------------------------------------------------------------------------


def ids(cfg):
    with override_settings(ECHOMQ=cfg):
        return [m.id for m in run_checks(databases=[]) if m.id.startswith("echomq_django.")]


def sched(**spec):
    # "q" named in QUEUES: a queue no setting names is warned about (W090)
    queues = {**GOOD.get("QUEUES", {}), "q": {}}
    return {
        **GOOD,
        "QUEUES": queues,
        "SCHEDULE": {"e": {"name": "orders.fulfil", "queue": "q", **spec}},
    }


@pytest.mark.usefixtures("no_env_url")
@pytest.mark.parametrize(
    "cfg, expected",
    [
        ({**GOOD, "QUEUES": {"q": {"RATE_LIMIT": {"MAX": 5, "PER_MS": 1000}}}}, []),
        ({**GOOD, "QUEUES": {"q": {"RATE_LIMIT": {"MAX": 0, "PER_MS": 1000}}}}, ["E050"]),
        ({**GOOD, "QUEUES": {"q": {"RATE_LIMIT": {"MAX": 5}}}}, ["E050"]),
        ({**GOOD, "QUEUES": {"q": {"RATE_LIMIT": 5}}}, ["E050"]),
        ({**GOOD, "QUEUES": {"q": {"TIMEOUT_MS": 5000}}}, []),
        ({**GOOD, "QUEUES": {"q": {"TIMEOUT_MS": 1.5}}}, ["E051"]),
        ({**GOOD, "SCHEDULE": []}, ["E052"]),
        ({**GOOD, "SCHEDULE": {"a:b": {}}}, ["E052"]),
        (sched(cron="*/5 * * * *"), []),
        (sched(every_s=60, payload={"a": 1}, priority=3, timeout_ms=10, max_attempts=2), []),
        (sched(every_s=60, colour="red"), ["E053"]),
        ({**GOOD, "SCHEDULE": {"e": {"queue": "q", "every_s": 1}}}, ["E053"]),
        (sched(every_s=60, queue="a b"), ["E053"]),
        (sched(cron="61 * * * *"), ["E054"]),
        (sched(cron="0 3 * *"), ["E054"]),
        (sched(), ["E055"]),
        (sched(cron="* * * * *", every_s=5), ["E055"]),
        (sched(every_s=0), ["E055"]),
        (sched(every_s="60"), ["E055"]),
        (sched(every_s=60, name="no.such.handler"), ["E056"]),
        (sched(every_s=60, tz="Mars/Olympus"), ["E058"]),
        (sched(every_s=60, priority=2**40), ["E058"]),
        (sched(every_s=60, payload={1, 2}), ["E058"]),
    ],
)
def test_scheduling_settings_have_stable_ids(cfg, expected) -> None:
    assert ids(cfg) == [f"echomq_django.{e}" for e in expected]


def test_a_bad_schedule_is_refused_naming_the_rule() -> None:
    with pytest.raises(ImproperlyConfigured, match="E054: SCHEDULE entry 'e': malformed cron"):
        entries({"e": {"name": "x", "queue": "q", "cron": "nope"}})
