"""Periodic jobs (``ECHOMQ["SCHEDULE"]``): exactly one job per tick however
many schedulers run, a first start fires no past tick, a restart shorter
than the period loses nothing, the schedule marks only move forward; a pump
fires its own queues' entries in its sweep and ``echomq_stats`` lists them;
and the checks of the scheduling settings, E050-E059 (E050, E051, E059: conf/timing.py)."""

from __future__ import annotations

import datetime as dt
import logging
import zoneinfo

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


def test_a_refused_payload_skips_its_tick_and_the_scheduler_goes_on(tmq, clock, caplog) -> None:
    big, small = every(60, key="big", payload="x" * 600_000), every(60, key="small")
    s = Scheduler(tmq, [big, small])
    s.fire_due()  # the marks are set
    clock.now = tick = s.next_due()
    with caplog.at_level(logging.ERROR, logger="echomq_django"):
        assert s.fire_due() == [("q", f"small-{tick}")]  # the pump did not die of it
    assert (
        caplog.records[-1]
        .getMessage()
        .startswith(
            "periodic job big: tick skipped, its payload is refused: payload is 600002 bytes"
        )
    )
    assert s.fire_due() == []  # marked: logged once per tick, not once per sweep


def test_a_first_start_fires_no_past_tick_then_one_job_per_tick(tmq, clock) -> None:
    s = Scheduler(tmq, [every(60, payload={"n": 1}, options={"priority": 2})])
    assert s.fire_due() == []  # the mark is set, nothing fired
    tick = s.next_due()
    clock.now = tick - 1
    assert s.fire_due() == []
    clock.now = tick
    assert s.fire_due() == [("q", f"beat-{tick}")]
    r = assert_state(tmq, "q", f"beat-{tick}", "pending")
    assert (r["n"], r["d"], r["priority"]) == ("ops.ping", '{"n":1}', "2")
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


# -- the clock: daylight-saving changes and restarts (docs/howto/periodic.md) ------

NEW_YORK = "America/New_York"  # 2026: spring forward Mar 8 02:00, fall back Nov 1 02:00


def utc_ms(*when: int) -> int:
    return int(dt.datetime(*when, tzinfo=dt.UTC).timestamp() * 1000)


def local(ms: int, tz: str = NEW_YORK) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, zoneinfo.ZoneInfo(tz)).isoformat()


def fired_between(mq, clock, entry: Entry, start: int, end: int, step_ms: int = MINUTE):
    """Drive one scheduler from ``start`` to ``end`` (ms) a step at a time, as
    a pump's loop would; returns the local times of the jobs it added."""
    clock.now = start
    scheduler = Scheduler(mq, [entry])
    added = []
    while clock.now < end:
        added += scheduler.fire_due()
        clock.advance(step_ms)
    ticks = [int(job_id.rsplit("-", 1)[1]) for _, job_id in added]
    assert len(set(ticks)) == len(ticks) == mq.counts(entry.queue)["pending"]
    return [local(t, entry.tz) for t in ticks]


def cron(rule: str, tz: str = NEW_YORK) -> Entry:
    return Entry(key="c", name="ops.ping", queue="q", cron=rule, tz=tz)


def test_a_wall_clock_time_that_happens_twice_fires_once(tmq, clock) -> None:
    """Fall back: 01:30 happens at 05:30 and 06:30 UTC on Nov 1; a daily
    01:30 rule fires at the first only (croniter alone answers both)."""
    fired = fired_between(
        tmq, clock, cron("30 1 * * *"), utc_ms(2026, 10, 31, 12), utc_ms(2026, 11, 2, 12)
    )
    assert fired == ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]


def test_a_wall_clock_time_that_never_happens_fires_once_after_the_gap(tmq, clock) -> None:
    """Spring forward: 02:30 does not exist on Mar 8; it fires once, at
    03:00 (the first instant after the gap), as croniter and cron answer."""
    fired = fired_between(
        tmq, clock, cron("30 2 * * *"), utc_ms(2026, 3, 7, 12), utc_ms(2026, 3, 9, 12)
    )
    assert fired == ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]


def test_a_wildcard_hour_rule_counts_elapsed_time_across_fall_back(tmq, clock) -> None:
    """Every 30 minutes keeps firing every 30 real minutes through the hour
    that repeats (cron's rule for wildcard hours): no hole of 90 minutes."""
    fired = fired_between(
        tmq, clock, cron("*/30 * * * *"), utc_ms(2026, 11, 1, 4), utc_ms(2026, 11, 1, 7, 1)
    )
    assert fired == [
        "2026-11-01T00:30:00-04:00",
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:30:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T01:30:00-05:00",
        "2026-11-01T02:00:00-05:00",
    ]


def test_every_s_across_pump_restarts_fires_each_tick_once(tmq, clock) -> None:
    """Pumps restarted mid-period, across a tick, and an old pump still
    sweeping while its successor starts: each tick fires exactly once."""
    entry = every(60)
    start = T0 - T0 % MINUTE + 10_000
    clock.now = start
    old = Scheduler(tmq, [entry])
    assert old.fire_due() == []  # first start: the mark only
    fired = []
    plan = [  # (ms after start, the schedulers alive then)
        (50_000, "old"),  # tick 1
        (80_000, "old new"),  # new starts mid-period while old still runs
        (110_000, "old new"),  # tick 2: both sweep it
        (130_000, "new"),  # old stopped
        (190_000, "newer"),  # new down across tick 3, restarted 20 s after it
        (230_000, "newer"),  # tick 4
    ]
    alive = {"old": old}
    for at, names in plan:
        clock.now = start + at
        for name in names.split():
            alive.setdefault(name, Scheduler(tmq, [entry]))
            fired += alive[name].fire_due()
    first = start - start % MINUTE + MINUTE
    assert fired == [("q", f"beat-{first + i * MINUTE}") for i in range(4)]
    assert tmq.counts("q")["pending"] == 4


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
    bare = Pump(["q"], mq=tmq).scheduler  # only run-time entries, read at each sweep
    assert (bare.entries, bare.runtime_queues) == ([], ["q"])


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
        (sched(every_s=60, payload="x" * 600_000), ["E058"]),  # over MAX_PAYLOAD_BYTES
        ({**sched(every_s=60, payload="x" * 100), "MAX_PAYLOAD_BYTES": 50}, ["E058"]),
    ],
)
def test_scheduling_settings_have_stable_ids(cfg, expected) -> None:
    assert ids(cfg) == [f"echomq_django.{e}" for e in expected]


@pytest.mark.usefixtures("no_env_url")
def test_a_croniter_older_than_6_1_is_named_by_e057(monkeypatch) -> None:
    """Earlier croniter releases answer a time in a daylight-saving gap at
    the old offset (the gap tests above fail on 2.0.7)."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "2.0.7" if name == "croniter" else real(name)
    )
    with override_settings(ECHOMQ=sched(cron="30 2 * * *")):
        found = [m for m in run_checks(databases=[]) if m.id == "echomq_django.E057"]
    assert [m.msg for m in found] == [
        "SCHEDULE uses 'cron' but croniter 2.0.7 is installed, older than 6.1: "
        "its times on daylight-saving nights are off by the gap"
    ]
    assert ids(sched(every_s=60)) == []  # no cron: croniter's age does not matter


def test_a_bad_schedule_is_refused_naming_the_rule() -> None:
    with pytest.raises(ImproperlyConfigured, match="E054: SCHEDULE entry 'e': malformed cron"):
        entries({"e": {"name": "x", "queue": "q", "cron": "nope"}})
