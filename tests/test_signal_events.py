"""Durable signal events and their dispatcher, on both rigs: each transition
users act on writes its event in the same script; the dispatcher sends each
event's signal at least once, in order per queue, with its ``event_id``, and
removes it only after every receiver returned; a receiver that keeps raising
sends the event to the dead-letter after its tries while the queue's other
events flow."""

from __future__ import annotations

import json

import pytest

from echomq_django import EchoMQ, Flow, JobRef
from echomq_django.protocol.signal_events import SIGNAL_OF
from echomq_django.runners.dispatcher import Dispatcher
from echomq_django.runners.pump import Pump
from tests.support.eventkit import Raising, stream
from tests.support.fixtures import fan_in_options
from tests.support.jobkit import T0, claim_one, complete, kill, leaf, node

ALL = list(SIGNAL_OF)


@pytest.fixture
def tmq(redis_client, clock, request) -> EchoMQ:
    """An ``EchoMQ`` with the event calls on the test's rig, time ``clock``."""
    return EchoMQ(redis_client, prefix="emq", clock=clock, **fan_in_options(request))


def tree(mq) -> None:
    """g <- p <- (a, b): b fails p (fp), so p and g die; r <- c (ignored)."""
    mq.add_flow(node("g", [node("p", [leaf("a"), leaf("b")])]))
    mq.add_flow(node("r", [leaf("c", ignore_dependency_on_failure=True)]))


def transitions(mq) -> None:
    complete(mq, "a", {"x": 1})
    kill(mq, "b", "boom")
    kill(mq, "c", "gone")


EXPECTED = [
    ("completed", "a", "leaf", '{"x":1}'),
    ("dead", "b", "leaf", "boom"),
    ("flow_failed", "p", "node", "failed by child emq:{q}:job:b: boom"),
    ("dead", "p", "node", "failed by child emq:{q}:job:b: boom"),
    (
        "flow_failed",
        "g",
        "node",
        "failed by child emq:{q}:job:p: failed by child emq:{q}:job:b: boom",
    ),
    ("dead", "g", "node", "failed by child emq:{q}:job:p: failed by child emq:{q}:job:b: boom"),
    ("dead", "c", "leaf", "gone"),
    ("released", "r", "node", None),
]


def test_nothing_is_recorded_for_a_queue_nobody_subscribed(tmq):
    tree(tmq)
    transitions(tmq)
    assert stream(tmq) == []
    assert tmq.client.exists(tmq.keys.queue_key("q", "signals:kinds")) == 0


def test_each_transition_records_its_event_in_the_same_script(tmq):
    assert tmq.signal_events.subscribe(["q"], ALL) == ALL
    tree(tmq)
    transitions(tmq)
    events = stream(tmq)
    assert [e[1:] for e in events] == EXPECTED
    assert len({e[0] for e in events}) == len(EXPECTED)  # one stream id each


def test_a_cancel_records_the_cancel_then_the_death_and_the_parent_s_fate(tmq):
    tmq.signal_events.subscribe(["q"], ALL)
    tmq.add_flow(node("p", [leaf("a"), leaf("b", ignore_dependency_on_failure=True)]))
    complete(tmq, "a", 1)
    tmq.cancel("q", "b")
    assert [e[1:] for e in stream(tmq)] == [
        ("completed", "a", "leaf", "1"),
        ("cancelled", "b", "leaf", "cancelled"),
        ("dead", "b", "leaf", "cancelled"),
        ("released", "p", "node", None),
    ]


def test_a_job_cancelled_while_it_runs_records_the_cancel_when_it_dies(tmq):
    tmq.signal_events.subscribe(["q"], ALL)
    tmq.add_flow(Flow("q", "leaf", {}, job_id="r"))
    job = claim_one(tmq, "q", "r")
    tmq.cancel("q", "r")  # marked: it dies when its worker reports
    assert stream(tmq) == []
    [refused] = tmq.complete_many([(job, 1)])
    assert isinstance(refused, Exception)
    assert [e[1:] for e in stream(tmq)] == [
        ("cancelled", "r", "leaf", "cancelled"),
        ("dead", "r", "leaf", "cancelled"),
    ]


def test_only_the_subscribed_kinds_are_recorded(tmq):
    tmq.signal_events.subscribe(["q"], ["released", "flow_failed"])
    tree(tmq)
    transitions(tmq)
    assert [e[1:3] for e in stream(tmq)] == [
        ("flow_failed", "p"),
        ("flow_failed", "g"),
        ("released", "r"),
    ]


def test_subscribe_refuses_an_unknown_kind_and_writes_nothing(tmq):
    with pytest.raises(ValueError, match=r"unknown event kinds \['finished'\]: use completed, "):
        tmq.signal_events.subscribe(["q"], ["completed", "finished"])
    assert tmq.client.exists(tmq.keys.queue_key("q", "signals:kinds")) == 0


@pytest.mark.via_flow_outbox
def test_a_cross_queue_parent_s_event_lands_on_its_own_queue_when_delivered(tmq):
    tmq.signal_events.subscribe(["p", "c"], ALL)
    tmq.add_flow(Flow("p", "parent", {}, job_id="P", children=[Flow("c", "kid", {}, job_id="k")]))
    complete(tmq, "k", 7, queue="c")
    assert [e[1:] for e in stream(tmq, "c")] == [("completed", "k", "kid", "7")]
    assert stream(tmq, "p") == []  # the parent's queue learns it from the pump
    Pump(["c"], mq=tmq).sweep()  # delivers c's outbox, dispatches c's events only
    assert stream(tmq, "c") == []
    assert [e[1:] for e in stream(tmq, "p")] == [("released", "P", "parent", None)]


def test_dispatch_sends_each_event_once_in_order_with_its_event_id(tmq, seen):
    tmq.signal_events.subscribe(["q"], ALL)
    tree(tmq)
    transitions(tmq)
    ids = [f"q:{e[0]}" for e in stream(tmq)]
    d = Dispatcher(["q"], mq=tmq)
    report = d.dispatch_all()["q"]
    assert (report.sent, report.deadlettered, report.retry_in_ms) == (8, 0, None)
    assert seen.pairs() == [
        ("job_completed", "a"),
        ("job_dead", "b"),
        ("flow_failed", "p"),
        ("job_dead", "p"),
        ("flow_failed", "g"),
        ("job_dead", "g"),
        ("job_dead", "c"),
        ("parent_released", "r"),
    ]
    assert seen.ids() == ids
    assert seen.got[0][2] == {
        "queue": "q",
        "job_id": "a",
        "ref": JobRef("q", "a"),
        "job_name": "leaf",
        "result": {"x": 1},
        "event_id": ids[0],
    }
    assert seen.got[1][2] == {
        "queue": "q",
        "job_id": "b",
        "ref": JobRef("q", "b"),
        "job_name": "leaf",
        "error": "boom",
        "event_id": ids[1],
    }
    assert seen.got[2][2]["child"] == JobRef("q", "b")  # flow_failed names the child
    assert seen.got[2][2]["error"] == "failed by child q/b: boom"
    assert seen.got[7][2] == {
        "queue": "q",
        "job_id": "r",
        "ref": JobRef("q", "r"),
        "job_name": "node",
        "event_id": ids[7],
    }
    assert stream(tmq) == []
    assert d.dispatch_all()["q"].sent == 0 and len(seen.got) == 8


def test_the_backlog_shows_until_dispatched_and_nothing_trims_it(tmq, clock):
    tmq.signal_events.subscribe(["q"], ALL)
    tmq.add_flows([Flow("q", "leaf", {}, job_id=f"j{i}") for i in range(300)])
    for job in tmq.claim("q", 300):
        tmq.complete(job, 1)
    first_ms = int(stream(tmq)[0][0].split("-")[0])
    clock.now = first_ms + 2500
    assert tmq.signal_events.backlog("q") == {"pending": 300, "deadlettered": 0, "oldest_ms": 2500}
    report = Dispatcher(["q"], mq=tmq, batch=64).dispatch("q")
    assert report.sent == 300
    assert tmq.signal_events.backlog("q") == {"pending": 0, "deadlettered": 0, "oldest_ms": None}


def test_echomq_stats_shows_the_backlog(tmq, clock):
    from echomq_django.monitoring.stats import queue_stats

    tmq.signal_events.subscribe(["q"], ALL)
    tmq.add_flows([Flow("q", "leaf", {}, job_id=f"j{i}") for i in range(3)])
    for i in range(3):
        complete(tmq, f"j{i}", i)
    clock.now = int(stream(tmq)[0][0].split("-")[0]) + 1500
    got = queue_stats(tmq, "q")
    assert (got["signals"], got["signals_oldest_age_s"], got["signals_deadletter"]) == (3, 1.5, 0)


def test_a_receiver_that_always_raises_is_dead_lettered_after_its_tries(tmq, seen, clock):
    tmq.signal_events.subscribe(["q"], ALL)
    tmq.add_flows([Flow("q", "leaf", {}, job_id=i) for i in ("a", "b")])
    complete(tmq, "a", 1)
    complete(tmq, "b", 2)
    [xa, _xb] = [e[0] for e in stream(tmq)]
    bad = Raising({"a"})
    try:
        d = Dispatcher(["q"], mq=tmq, tries=3, backoff_ms=0)
        reports = [d.dispatch("q") for _ in range(3)]
    finally:
        bad.close()
    assert [(r.sent, r.deadlettered, r.retry_in_ms) for r in reports] == [
        (0, 0, 0),
        (0, 0, 0),
        (1, 1, None),
    ]
    # the receiver that returned got "a" once; the failing one three times;
    # "b" waited behind "a" and then went to both, once
    assert seen.pairs() == [("job_completed", "a"), ("job_completed", "b")]
    assert bad.calls == {"a": 3, "b": 1}
    label = "tests.support.eventkit.Raising"
    assert tmq.signal_events.deadlettered("q") == [
        {
            "event_id": f"q:{xa}",
            "kind": "completed",
            "job_id": "a",
            "job_name": "leaf",
            "value": "1",
            "reason": f"{label} raised RuntimeError('no a') (3 tries)",
            "tries": 3,
            "at": T0,
        }
    ]
    assert tmq.signal_events.backlog("q") == {"pending": 0, "deadlettered": 1, "oldest_ms": None}
    assert tmq.client.exists(tmq.keys.queue_key("q", "signals:tries")) == 0


def test_a_failing_event_waits_out_its_backoff_and_holds_the_queue(tmq, seen):
    tmq.signal_events.subscribe(["q"], ALL)
    tmq.add_flows([Flow("q", "leaf", {}, job_id=i) for i in ("a", "b")])
    complete(tmq, "a", 1)
    complete(tmq, "b", 2)
    bad = Raising({"a"})
    try:
        d = Dispatcher(["q"], mq=tmq, tries=3, backoff_ms=60_000)
        first, second = d.dispatch("q"), d.dispatch("q")
    finally:
        bad.close()
    assert (first.sent, first.retry_in_ms) == (0, 60_000)
    assert second.sent == 0 and 0 < second.retry_in_ms <= 60_000
    assert bad.calls == {"a": 1} and seen.pairs() == [("job_completed", "a")]
    assert [e[2] for e in stream(tmq)] == ["a", "b"]


def test_the_dead_letter_keeps_the_newest(tmq, monkeypatch):
    monkeypatch.setattr("echomq_django.protocol.signal_events.DEADLETTER_MAX", 2)
    tmq.signal_events.subscribe(["q"], ALL)
    tmq.add_flows([Flow("q", "leaf", {}, job_id=f"j{i}") for i in range(3)])
    for i in range(3):
        complete(tmq, f"j{i}", i)
    bad = Raising({"j0", "j1", "j2"})
    try:
        Dispatcher(["q"], mq=tmq, tries=1).dispatch("q")
    finally:
        bad.close()
    assert [e["job_id"] for e in tmq.signal_events.deadlettered("q")] == ["j2", "j1"]


def test_two_dispatchers_never_hold_one_queue_at_once(tmq, seen):
    tmq.signal_events.subscribe(["q"], ALL)
    tmq.add_flows([Flow("q", "leaf", {}, job_id=f"j{i}") for i in range(3)])
    for i in range(3):
        complete(tmq, f"j{i}", i)
    other = Dispatcher(["q"], mq=tmq)
    during = []

    def meanwhile(sender, **kw):
        during.append(other.dispatch("q"))

    from echomq_django.signals import job_completed

    job_completed.connect(meanwhile, weak=False)
    try:
        assert Dispatcher(["q"], mq=tmq).dispatch("q").sent == 3
    finally:
        job_completed.disconnect(meanwhile)
    assert [(r.locked, r.sent) for r in during] == [(True, 0)] * 3
    assert seen.pairs() == [("job_completed", f"j{i}") for i in range(3)]


def test_a_pass_that_dies_before_its_ack_sends_again_with_the_same_event_ids(tmq, seen):
    tmq.signal_events.subscribe(["q"], ALL)
    tmq.add_flows([Flow("q", "leaf", {}, job_id=f"j{i}") for i in range(5)])
    for i in range(5):
        complete(tmq, f"j{i}", i)

    def die(queue, acks):
        raise KeyboardInterrupt  # the pass stops between sending and acking

    with pytest.raises(KeyboardInterrupt):
        Dispatcher(["q"], mq=tmq, batch=3, before_ack=die).dispatch("q")
    first = seen.ids()
    assert len(first) == 3
    Dispatcher(["q"], mq=tmq, batch=3).dispatch("q")
    assert seen.pairs()[3:] == [("job_completed", f"j{i}") for i in range(5)]
    assert seen.ids()[3:6] == first  # the repeats carry the same event_id
    assert stream(tmq) == []


def test_start_dispatches_in_the_background_as_events_land(tmq, seen):
    tmq.signal_events.subscribe(["q"], ALL)
    d = Dispatcher(["q"], mq=tmq, block_ms=200)
    d.start()
    try:
        tmq.add_flow(Flow("q", "leaf", {}, job_id="j"))
        complete(tmq, "j", {"ok": True})
        from tests.support.workerkit import wait_for

        wait_for(lambda: seen.got, what="the dispatcher thread to send")
    finally:
        d.stop()
    assert seen.pairs() == [("job_completed", "j")]
    assert json.dumps(seen.got[0][2]["result"]) == '{"ok": true}'


def test_a_running_pump_sends_the_signals_from_its_dispatcher_threads(tmq, seen):
    import threading

    from tests.support.workerkit import wait_for

    stop = threading.Event()
    dispatcher = Dispatcher(["q"], mq=tmq, block_ms=100)  # a quick stop
    pump = Pump(["q"], mq=tmq, register=False, dispatcher=dispatcher)
    thread = threading.Thread(
        target=pump.run, kwargs={"interval": 0.05, "should_stop": stop.is_set}
    )
    thread.start()
    try:
        wait_for(lambda: pump.dispatcher.running, what="the pump's dispatcher threads")
        tmq.add_flow(node("p", [leaf("a")]))
        complete(tmq, "a", 1)
        wait_for(lambda: len(seen.got) == 2, what="both signals")
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive() and not pump.dispatcher.running
    assert seen.pairs() == [("job_completed", "a"), ("parent_released", "p")]
    assert {sender for _, sender, _ in seen.events} == {pump.dispatcher}


@pytest.mark.parametrize(
    ("setting", "value", "cid"),
    [("SIGNAL_TRIES", 0, "E070"), ("SIGNAL_BACKOFF_MS", -1, "E071"), ("SIGNAL_TRIES", "3", "E070")],
)
def test_bad_signal_settings_are_reported_by_the_system_checks(settings, setting, value, cid):
    from echomq_django.checks import check_settings

    settings.ECHOMQ = {**settings.ECHOMQ, setting: value}
    [error] = [e for e in check_settings() if e.id.startswith("echomq_django.E07")]
    assert error.id == f"echomq_django.{cid}"
    assert (
        error.msg
        == f"ECHOMQ['{setting}'] must be an integer >= {1 if cid == 'E070' else 0}, got {value!r}"
    )
