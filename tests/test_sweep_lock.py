"""The sweep lock of a queue's flow outbox, on both rigs: two pumps sweeping
one outbox release each parent once; a pump whose lock expired mid-sweep
does not trim over the new holder; a remove or cancel that must deliver
its own entries waits for a sweeping pump by blocking on Redis (woken by
the holder's drop, or by the lock's expiry when the holder died), never by
polling, and delivers them once."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from echomq_django import EchoMQ
from echomq_django.protocol.outbox import SENT_WAIT_S
from echomq_django.runners.pump import Pump
from tests.support.jobkit import (
    assert_each_parent_released_once,
    assert_state,
    leaf,
    node,
    rows,
    sweep,
    wide_cross_flows,
)

# The flow outbox's own path, on the single server too (on one server a
# cross-queue completion skips it by default: tests/support/fixtures.py).
pytestmark = pytest.mark.via_flow_outbox


def test_two_pumps_sweeping_one_outbox_release_each_parent_once(mq):
    wide_cross_flows(mq, parents=20, children=10)
    stop = threading.Event()
    errors = []

    def pump_loop():
        pump = Pump(["c"], mq=EchoMQ(mq.client), batch=7)
        try:
            while not stop.is_set():
                pump.sweep()
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=pump_loop) for _ in range(2)]
    for t in threads:
        t.start()
    while jobs := mq.claim("c", 13):
        for job in jobs:
            mq.complete(job, job.id)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    Pump(["c"], mq=mq).sweep()  # whatever the racing pumps left
    assert_each_parent_released_once(mq, parents=20, children=10)


def test_a_pump_whose_lock_expired_does_not_trim_over_the_new_holder(mq):
    wide_cross_flows(mq, parents=3, children=5)
    while jobs := mq.claim("c", 50):
        for job in jobs:
            mq.complete(job, job.id)
    lock_key = mq.keys.queue_key("c", "pump:lock")

    def lose_lock_mid_sweep(queue, actions):
        mq.client.delete(lock_key)  # as if our lock expired while we delivered
        other = Pump(["c"], mq=EchoMQ(mq.client)).sweep()["c"]
        assert (other["delivered"], other["released"]) == (15, 0)

    report = Pump(["c"], mq=mq, before_trim=lose_lock_mid_sweep).sweep()["c"]
    assert report["lock_lost"] is True and report["delivered"] == 0
    assert_each_parent_released_once(mq, parents=3, children=5)


# -- a remove waits for a sweeping pump, blocked on Redis ----------------------


def test_remove_waits_out_a_sweeping_pump_then_delivers_its_entries_once(tmq) -> None:
    """A pump holds q's outbox (its sweep's lease, 300 ms here): remove waits
    for it instead of leaving its `rm` to a sweep that may have read the
    outbox already, then delivers it and takes it out."""
    flow = node("p", [leaf("x", queue="o")])
    tmq.add_flow(flow)
    assert tmq.outbox.lock("q", "a-sweeping-pump", 300)
    tmq.remove("q", "p")
    assert rows(tmq, "o") == []
    assert tmq.client.llen(tmq.keys.queue_key("q", "flow:outbox")) == 0
    tmq.add_flow(flow)
    sweep(tmq, "q", "o")
    assert_state(tmq, "o", "x", "pending")


def count_takes(mq, queue: str) -> list[bool]:
    """Record, from now on, what each take of ``queue``'s sweep lock by
    ``mq`` answered (its drops are not counted)."""
    takes: list[bool] = []
    original = mq.outbox.lock

    def counted(q, token, lease_ms, take=True):
        held = original(q, token, lease_ms, take)
        if take and q == queue:
            takes.append(held)
        return held

    mq.outbox.lock = counted
    return takes


def command_calls(mq, queue: str, command: str) -> int:
    """How many times the master of ``queue``'s slot has run ``command``
    (INFO commandstats)."""
    client, target = mq.client, {}
    if isinstance(client, RedisCluster):
        target = {"target_nodes": client.get_node_from_key(mq.keys.queue(queue).pump_lock)}
    stats = client.info("commandstats", **target)
    return stats.get(f"cmdstat_{command.lower()}", {}).get("calls", 0)


def drop_later(holder, token: str, after_s: float) -> tuple[threading.Thread, list[bool]]:
    """A thread that drops ``holder``'s sweep lock on q after ``after_s``."""
    dropped: list[bool] = []

    def run() -> None:
        time.sleep(after_s)
        dropped.append(holder.outbox.lock("q", token, 10_000, take=False))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, dropped


def test_remove_blocked_on_a_held_sweep_lock_goes_on_when_the_holder_drops_it(tmq) -> None:
    """The pump's lease (10 s) outlasts SENT_WAIT_S, so only its drop lets
    remove deliver its `rm` entry. remove blocks on the lock's released list
    and wakes at the drop: two takes of the lock (refused, then held), where
    the old loop took it every 5 ms (some 40 times in the 200 ms)."""
    tmq.add_flow(node("p", [leaf("x", queue="o")]))
    pump = EchoMQ(tmq.client, prefix="emq")
    assert pump.outbox.lock("q", "a-sweeping-pump", 10_000)
    takes, blpops = count_takes(tmq, "q"), command_calls(tmq, "q", "blpop")
    thread, dropped = drop_later(pump, "a-sweeping-pump", 0.2)
    began = time.monotonic()
    tmq.remove("q", "p")
    took = time.monotonic() - began
    thread.join(10)
    assert dropped == [True]
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []  # the rm entry reached x
    assert tmq.client.llen(tmq.keys.queue("q").outbox) == 0
    assert takes[0] is False and takes[-1] is True and len(takes) <= 4, takes
    assert 1 <= command_calls(tmq, "q", "blpop") - blpops <= 3
    assert took < SENT_WAIT_S  # it did not wait for the give-up


def test_a_sweep_lock_whose_holder_died_is_taken_when_its_lease_ends(tmq) -> None:
    """A dead pump drops nothing: the wait ends at the lock's expiry (its
    PTTL bounds the BLPOP), and remove delivers then, not after SENT_WAIT_S
    (when it would give up and leave the entry in the outbox)."""
    tmq.add_flow(node("p", [leaf("x", queue="o")]))
    assert EchoMQ(tmq.client, prefix="emq").outbox.lock("q", "a-dead-pump", 800)
    takes = count_takes(tmq, "q")
    began = time.monotonic()
    tmq.remove("q", "p")
    took = time.monotonic() - began
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []
    assert tmq.client.llen(tmq.keys.queue("q").outbox) == 0
    assert takes[0] is False and takes[-1] is True and len(takes) <= 4, takes
    assert 0.5 <= took < SENT_WAIT_S  # after the lease, before the give-up


def test_each_drop_of_the_sweep_lock_wakes_the_next_waiter(tmq) -> None:
    """Two removes wait on one held lock: the pump's drop wakes one, whose
    own drop, after it delivered, wakes the other. Both entries are
    delivered and the outbox is empty; no remove waited for the give-up."""
    for i in (1, 2):
        tmq.add_flow(node(f"p{i}", [leaf(f"x{i}", queue="o")]))
    pump = EchoMQ(tmq.client, prefix="emq")
    assert pump.outbox.lock("q", "a-sweeping-pump", 10_000)
    errors: list[BaseException] = []

    def remove(job_id: str) -> None:
        try:
            EchoMQ(tmq.client, prefix="emq").remove("q", job_id)
        except BaseException as err:  # reported by the assert below
            errors.append(err)

    removers = [threading.Thread(target=remove, args=(f"p{i}",), daemon=True) for i in (1, 2)]
    began = time.monotonic()
    for t in removers:
        t.start()
    thread, dropped = drop_later(pump, "a-sweeping-pump", 0.3)
    for t in [*removers, thread]:
        t.join(10)
    took = time.monotonic() - began
    assert errors == [] and dropped == [True]
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []
    assert tmq.client.llen(tmq.keys.queue("q").outbox) == 0
    assert took < SENT_WAIT_S


def test_the_wait_stays_under_a_short_socket_timeout(tmq) -> None:
    """A client whose reads time out after 0.5 s, and are not re-sent: each
    BLPOP ends before that (a cut one raised RedisUnavailable), and the
    remove still goes on at the drop, a second later."""
    client, once = tmq.client, {"socket_timeout": 0.5, "retry": Retry(NoBackoff(), 0)}
    if isinstance(client, RedisCluster):
        node0 = client.get_default_node()
        short = RedisCluster(host=node0.host, port=node0.port, **once)
    else:
        kw = client.connection_pool.connection_kwargs
        short = redis.Redis(host=kw["host"], port=kw["port"], **once)
    try:
        mq = EchoMQ(short, prefix="emq")
        mq.add_flow(node("p", [leaf("x", queue="o")]))
        pump = EchoMQ(client, prefix="emq")
        assert pump.outbox.lock("q", "a-sweeping-pump", 10_000)
        thread, dropped = drop_later(pump, "a-sweeping-pump", 1.0)
        mq.remove("q", "p")
        thread.join(10)
        assert dropped == [True]
        assert rows(tmq, "q") == [] and rows(tmq, "o") == []
        assert client.llen(tmq.keys.queue("q").outbox) == 0
    finally:
        short.close()


def test_the_released_list_holds_one_mark_that_expires(tmq) -> None:
    """Each drop leaves one mark, never more, with a TTL of at most 1 s; a
    drop of a lock that is not the caller's leaves none."""
    unlocked = tmq.keys.queue("q").pump_unlocked
    for i in range(100):
        assert tmq.outbox.lock("q", f"pump-{i}", 2_000)
        assert tmq.outbox.lock("q", f"pump-{i}", 2_000, take=False)
    assert tmq.client.lrange(unlocked, 0, -1) == [b"1"]
    assert 0 < tmq.client.pttl(unlocked) <= 1_000
    tmq.client.delete(unlocked)
    assert tmq.outbox.lock("q", "the-holder", 2_000)
    assert not tmq.outbox.lock("q", "not-the-holder", 2_000, take=False)
    assert tmq.client.exists(unlocked) == 0
    assert tmq.outbox.lock("q", "the-holder", 2_000, take=False)
